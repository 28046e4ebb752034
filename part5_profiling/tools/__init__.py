"""Part 5's studies: the measurements behind each choice part 5's kernels make, run as modules
(`python -m part5_profiling.tools.profile --part 4`), each writing its CSV under results/<gpu>/."""
