"""Replicating an application's own SQLite tables (docs/attach.md): orchestration only; the
SQL lives in :mod:`syncpack.store.appdb` (the application's file) and
:mod:`syncpack.store.attached` (the site's store)."""
