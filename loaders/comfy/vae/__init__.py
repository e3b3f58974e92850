"""Tiled VAE decode over several devices (``tiled_decode``) and what it takes from a LATENT and a
VAE (``latent_inputs``)."""
