"""Reference models for kiln's configs: small ones of our own, and factories for
transformers and torchvision models."""
