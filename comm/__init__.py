"""What the stages share to talk to each other: Ray helpers (actors.py), rendezvous stores
(rendezvous.py) and the weight-sync wire protocol (weight_protocol.py). Imports nothing from the
other packages (docs/ARCHITECTURE.md section 3)."""
