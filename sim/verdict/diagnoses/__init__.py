"""The diagnoses by topic; sim/verdict/diagnoses/registry.py registers them in one order (DIAGNOSES)."""
