"""The campaign ledger: a state-store port and its adapters (Postgres, MSSQL, local file)."""
