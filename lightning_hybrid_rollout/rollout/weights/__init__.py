"""The weight path's pieces: :mod:`.format` (wire format and checksums)."""
