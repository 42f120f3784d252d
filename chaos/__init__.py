"""Fault injection: partitions and network faults as data, the commands that apply them,
and parsers for what a person types (durations, signals, rates, node lists)."""
