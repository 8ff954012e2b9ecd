"""Sandbox backends behind one small interface (see ``base``), looked up by name (see ``registry``)."""
