"""The log judges: rule sets and signatures over server logs, the failure-class diagnosis and kernel-selection
lines. Pure text in, verdicts out."""
