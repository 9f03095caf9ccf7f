"""The run: Hydra entry points (train, evaluate, analyze, submit), its config schema and stages."""
