"""What the stages share: Ray helpers (actors.py), the device an actor reserved (devices.py),
rendezvous stores (rendezvous.py), the weight-sync wire protocol (weight_protocol.py), and the
per-group statistics the advantage estimators and the ACR monitor both compute from
(groups.py, collapse.py).
Imports nothing from the other packages (docs/ARCHITECTURE.md section 3)."""
