"""Feature extractors: the networks every method trains (Conv-4, ResNet-12, WRN-28-10)."""
