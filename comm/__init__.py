"""What the stages share: Ray helpers (actors.py), the device an actor reserved (devices.py),
rendezvous stores (rendezvous.py) and the weight-sync wire protocol (weight_protocol.py).
Imports nothing from the other packages (docs/ARCHITECTURE.md section 3)."""
