package sqlstore

import (
	"context"
	"database/sql"
	"errors"
	"time"

	"github.com/sandbot/sandbot/store"
)

// ModuleArtifact implements store.ModuleArtifacts.
func (s *Store) ModuleArtifact(ctx context.Context, moduleHash, platform string) (*store.ModuleArtifact, error) {
	a := store.ModuleArtifact{ModuleHash: moduleHash, Platform: platform}
	err := s.q.QueryRowxContext(ctx, s.rebind(`SELECT name, code, prepared, mac FROM module_artifacts WHERE module_hash = ? AND platform = ?`),
		moduleHash, platform).Scan(&a.Name, &a.Code, &a.Prepared, &a.MAC)
	if errors.Is(err, sql.ErrNoRows) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	return &a, nil
}

// PutModuleArtifact implements store.ModuleArtifacts.
func (s *Store) PutModuleArtifact(ctx context.Context, a *store.ModuleArtifact) error {
	_, err := s.q.ExecContext(ctx, s.rebind(`INSERT INTO module_artifacts (module_hash, platform, name, code, prepared, mac, created_at)
		VALUES (?, ?, ?, ?, ?, ?, ?) ON CONFLICT (module_hash, platform) DO NOTHING`),
		a.ModuleHash, a.Platform, a.Name, a.Code, a.Prepared, a.MAC, time.Now().UnixMilli())
	return err
}
