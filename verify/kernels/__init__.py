"""Kernel evidence: autotune caches and their policies, and kernel churn between two runs."""
