"""The experiment harness: grids of training runs (conf/reproduce/), their rows and aggregate."""
