package sqlstore

// DisableReadCache turns the SQLite read cache off, for benchmarks that
// measure reads from the database itself.
func DisableReadCache(s *Store) { s.cache = nil }
