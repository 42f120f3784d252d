"""The diagnoses by topic; sim/verdict/diagnose.py registers them in one order (DIAGNOSES)."""
