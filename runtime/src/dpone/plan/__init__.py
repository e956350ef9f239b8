"""The pure planning core: chunk plans, mapping plans, canonical JSON and fingerprints.

Standard library only; shared by the generator and the runtime so both compute the same bytes.
"""
