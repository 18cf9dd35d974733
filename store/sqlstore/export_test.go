package sqlstore

// DisableReadCache turns the SQLite read cache off, for benchmarks that
// measure reads from the database itself.
func DisableReadCache(s *Store) { s.cache = nil }

// HotHolds tells whether s's hot cache (PostgreSQL's) holds the row of id.
func HotHolds(s *Store, resourceType, id string) bool {
	if s.hot == nil {
		return false
	}
	_, ok := s.hot.get(resourceType, id)
	return ok
}
