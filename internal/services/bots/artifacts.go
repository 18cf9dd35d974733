package bots

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"sync"

	"github.com/sandbot/sandbot/runtime"
	"github.com/sandbot/sandbot/store"
)

// artifactKeyName is where the store keeps the key that authenticates the
// compiled modules replicas share (docs/decisions.md 41), unless the
// operator gives one (Config.ArtifactKey).
const artifactKeyName = "bots.module-artifact-key"

// artifacts adapts the store's compiled-module table to the runtime, with
// the key the replicas share.
type artifacts struct {
	st   store.ModuleArtifacts
	base store.Store
	mu   sync.Mutex
	key  []byte
}

func (a *artifacts) LoadArtifact(ctx context.Context, moduleHash, platform string) (*runtime.Artifact, error) {
	m, err := a.st.ModuleArtifact(ctx, moduleHash, platform)
	if m == nil || err != nil {
		return nil, err
	}
	return &runtime.Artifact{ModuleHash: m.ModuleHash, Platform: m.Platform, Name: m.Name, Code: m.Code, Prepared: m.Prepared, MAC: m.MAC}, nil
}

func (a *artifacts) StoreArtifact(ctx context.Context, r *runtime.Artifact) error {
	return a.st.PutModuleArtifact(ctx, &store.ModuleArtifact{ModuleHash: r.ModuleHash, Platform: r.Platform, Name: r.Name, Code: r.Code, Prepared: r.Prepared, MAC: r.MAC})
}

// sharing returns ctx with the runtime told to share compiled modules
// through the store, when it can.
func (s *Service) sharing(ctx context.Context) context.Context {
	a := s.artifacts
	if a == nil {
		return ctx
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.key == nil {
		v, err := a.base.KeyValue(ctx, artifactKeyName, func() (string, error) {
			b := make([]byte, 32)
			_, err := rand.Read(b)
			return hex.EncodeToString(b), err
		})
		if err != nil {
			s.log.Warn("bot module artifacts: key", "err", err)
			return ctx
		}
		if a.key, err = hex.DecodeString(v); err != nil || len(a.key) < 32 {
			s.log.Warn("bot module artifacts: stored key is not 32 hex bytes; not sharing compiled modules")
			a.key = []byte{}
		}
	}
	return runtime.WithArtifacts(ctx, a, a.key)
}
