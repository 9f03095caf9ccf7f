"""``python -m launch.bootstrap``: build (or find) the configured model and report it
(launch/models/bootstrap.py)."""

from launch.models.bootstrap import main

if __name__ == "__main__":
    main()
