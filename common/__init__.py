"""Shared machinery for every part: inputs, reference, checks, the PyTorch backward, benchmark."""
