"""Masked (absorbing-state) discrete diffusion objective and samplers."""
