"""Autoregressive objective and decoding."""
