"""Performance judgements as pure functions: A/B verdicts, bisection over versions, sweep curves."""
