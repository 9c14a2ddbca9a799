"""Launch units, input staging, capture/replay and engines."""
