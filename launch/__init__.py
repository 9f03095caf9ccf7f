"""Hydra entry points (train, evaluate, analyze, submit) and the config schema."""
