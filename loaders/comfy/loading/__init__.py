"""What the loader nodes call: the diffusion model loaded as core loads it, then sharded
(``model_loading``), the text encoders and the VAE on the planned devices (``component_loading``)
and a text encoder split over several devices (``text_encoder_split``)."""
