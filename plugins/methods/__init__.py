"""One module per paper method: its losses, samplers, evaluators and recipes."""
