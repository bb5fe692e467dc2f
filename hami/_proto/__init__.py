"""Vendored protobuf APIs and their generated code (regenerate with `make proto`)."""
