"""Tasks, answer extraction, process-isolated verifiers and intrinsic rewards."""
