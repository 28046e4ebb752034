"""This part's studies: what measures it, and the tables and plots of its README."""
