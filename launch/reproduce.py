"""``python -m launch.reproduce``: the command of the experiment harness
(launch/experiments/reproduce.py)."""

import sys

from launch.experiments.reproduce import main

if __name__ == "__main__":
    sys.exit(main())
