"""Lab scripts of the scheduler project: experiments, probes, profiles and peer comparisons.

Not part of the installed package. Run each from a checkout's root as ``python -m benchmarks.NAME
--help``; ``benchmarks/README.md`` says what each one is for.
"""
