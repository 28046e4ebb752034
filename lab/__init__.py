"""The lab: what measures the parts and publishes the numbers, on top of common/.

- measuring: bench (parts against SDPA's backends, checked first), timing (FLOPs and the timers),
  impls (what the benchmark compares), sweep and sweep_report (tile sweeps and their heatmaps),
  study (what every study shares), coldstart (first calls in a fresh process), targets (will each
  part compile and fit on other GPUs), train_step (a small Llama trained with each part);
- publishing: results (the CSVs: where, who wrote them, how they are read and shown) and report
  (CSVs -> README tables, results logs and plots; `make report`).

A part's own studies live in its tools/ folder and build on these; nothing in common/ imports lab.
"""
