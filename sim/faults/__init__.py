"""Faults: the catalog of fault kinds, the nemesis that carries them out, the faults in force and heal."""
