"""Replaying recorded trajectories as an OpenAI-compatible model."""
