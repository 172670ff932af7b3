"""Forensics and cost: stall capture (py-spy, spin detection) and CPU/GPU cost receipts."""
