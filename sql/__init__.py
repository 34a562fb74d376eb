"""Packaged SQL: sql/<engine>/*.sql ships inside the wheel as assetq.sql."""
