"""Shared pytest configuration: fixtures for the real control plane live in hami.testkit."""

pytest_plugins: list[str] = ["hami.testkit.pytest_plugin"]
