"""Thin framework adapters: they translate hooks into EnergySession events and nothing more."""
