package runtime

import (
	"bytes"
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	goruntime "runtime"
	"runtime/debug"
	"strings"
)

// Compiled modules are shared between replicas (docs/decisions.md 41): the
// replica that compiles a module (its compiler child) stores the machine
// code wazero wrote, an artifact, through an ArtifactStore (the database),
// and a replica that has not compiled the module loads that artifact into
// its own on-disk cache instead of compiling: a few milliseconds instead of
// seconds for a Go bot. An artifact is keyed by the module's hash and the
// platform (wazero's version, GOARCH, GOOS); its file name in wazero's cache
// encodes the CPU features too, so that code built for another CPU is never
// found by wazero (the replica then compiles). An artifact carries an
// HMAC-SHA256 under a key the replicas share: a replica writes into its
// cache, and so runs as native code, only bytes that a holder of the key
// produced, of the size it accepts (limits.ModuleArtifactBytes).

// Artifact is one module's compiled machine code, as wazero's on-disk
// cache holds it.
type Artifact struct {
	// ModuleHash is the module's HashBytes (of the code deployed).
	ModuleHash string
	// Platform is what the code is built for: wazero's cache directory
	// name, "wazero-<version>-<GOARCH>-<GOOS>".
	Platform string
	// Name is the file's path in wazero's cache directory.
	Name string
	Code []byte
	// Prepared is the module as the producing replica prepared it (the
	// rewrite's output and what the runtime keeps of its parse), so that a
	// replica loading the artifact skips the pre-parse and rewrite
	// (encodePrepared); empty: it prepares the module itself.
	Prepared []byte
	// MAC is the hex HMAC-SHA256 of the fields above (artifactMAC).
	MAC string
}

// ArtifactStore keeps artifacts for every replica (the database).
type ArtifactStore interface {
	// LoadArtifact returns the artifact of moduleHash for platform, or nil
	// when there is none.
	LoadArtifact(ctx context.Context, moduleHash, platform string) (*Artifact, error)
	// StoreArtifact keeps a, unless an artifact of the same module and
	// platform is kept already.
	StoreArtifact(ctx context.Context, a *Artifact) error
}

type artifactsKey struct{}

type artifactSharing struct {
	store ArtifactStore
	key   []byte
}

// WithArtifacts has the compilations asked under ctx share their compiled
// code through st, authenticated with key (at least 32 bytes): a module
// compiled here is stored, and a module compiled elsewhere is loaded from
// st instead of compiling it.
func WithArtifacts(ctx context.Context, st ArtifactStore, key []byte) context.Context {
	if st == nil || len(key) < 32 {
		return ctx
	}
	return context.WithValue(ctx, artifactsKey{}, &artifactSharing{store: st, key: key})
}

func artifactsOf(ctx context.Context) *artifactSharing {
	a, _ := ctx.Value(artifactsKey{}).(*artifactSharing)
	return a
}

// artifactMAC authenticates everything a replica acts on: the code, where
// it goes in the cache and which module and platform it is for.
func artifactMAC(key []byte, a *Artifact) string {
	m := hmac.New(sha256.New, key)
	for _, f := range []string{a.ModuleHash, a.Platform, a.Name} {
		fmt.Fprintf(m, "%d:%s\n", len(f), f)
	}
	fmt.Fprintf(m, "%d:", len(a.Code))
	m.Write(a.Code)
	m.Write(a.Prepared)
	return hex.EncodeToString(m.Sum(nil))
}

// wazeroDir is the name of wazero's version directory in its cache, which
// wazero derives from the build information the same way.
func wazeroDir() string {
	v := ""
	if info, ok := debug.ReadBuildInfo(); ok {
		for _, dep := range info.Deps {
			if strings.Contains(dep.Path, "github.com/tetratelabs/wazero") {
				v = dep.Version
			}
		}
		if v == "" || v == "(devel)" {
			v = info.Main.Version
		}
	}
	if v == "" || v == "(devel)" {
		v = "dev"
	}
	return "wazero-" + v + "-" + goruntime.GOARCH + "-" + goruntime.GOOS
}

// platform names what this build's compiled code runs on: wazero's
// directory name (its version, GOARCH, GOOS) or, when wazero's version is
// unknown ("dev": test binaries, builds without module information, whose
// code another build of the same "version" might not run), that name and
// the hash of this very executable. "" when nothing is shared.
func platform(cacheDir string) string {
	dir := wazeroDir()
	if st, err := os.Stat(filepath.Join(cacheDir, dir)); err != nil || !st.IsDir() {
		return ""
	}
	if !strings.HasPrefix(dir, "wazero-dev-") {
		return dir
	}
	f, err := os.Open("/proc/self/exe")
	if err != nil {
		exe, err2 := os.Executable()
		if err2 != nil {
			return ""
		}
		if f, err = os.Open(exe); err != nil {
			return ""
		}
	}
	defer f.Close()
	h := sha256.New()
	if _, err := io.Copy(h, f); err != nil {
		return ""
	}
	return dir + "+" + hex.EncodeToString(h.Sum(nil))[:24]
}

// validArtifactName accepts "<wazero's directory>/<64 hex digits>", wazero's
// file names, in the directory of platform: nothing a replica writes can land outside its cache directory.
func validArtifactName(platform, name string) bool {
	dir, file, ok := strings.Cut(name, "/")
	if !ok || (dir != platform && !strings.HasPrefix(platform, dir+"+")) || len(file) != 64 {
		return false
	}
	_, err := hex.DecodeString(file)
	return err == nil
}

// fetchArtifact looks for another replica's compiled code of the module and,
// if it is there, trusted and built for this platform, puts it into the
// cache directory, where load finds it. It reports whether it did.
func (r *Runtime) fetchArtifact(ctx context.Context, sh *artifactSharing, hash string) *Artifact {
	if r.platform == "" || r.cfg.Limits.ModuleArtifactBytes <= 0 {
		return nil
	}
	a, err := sh.store.LoadArtifact(ctx, hash, r.platform)
	if err != nil {
		r.metrics.artifacts.WithLabelValues("failed").Inc()
		r.log.Warn("bot module artifact: load", "hash", hash, "err", err)
		return nil
	}
	if a == nil {
		return nil
	}
	if a.ModuleHash != hash || a.Platform != r.platform || !validArtifactName(r.platform, a.Name) ||
		int64(len(a.Code))+int64(len(a.Prepared)) > r.cfg.Limits.ModuleArtifactBytes ||
		!hmac.Equal([]byte(artifactMAC(sh.key, a)), []byte(a.MAC)) {
		r.metrics.artifacts.WithLabelValues("rejected").Inc()
		r.log.Warn("bot module artifact refused: not authenticated or over the size bound; compiling instead", "hash", hash, "bytes", len(a.Code))
		return nil
	}
	dst := filepath.Join(r.cacheDir, filepath.FromSlash(a.Name))
	if _, err := os.Stat(dst); err == nil {
		return a
	}
	if err := writeFileAtomic(dst, a.Code); err != nil {
		r.metrics.artifacts.WithLabelValues("failed").Inc()
		r.log.Warn("bot module artifact: write", "hash", hash, "err", err)
		return nil
	}
	return a
}

// writeFileAtomic writes data to path through a temporary file and a
// rename, so that wazero never reads a partial file.
func writeFileAtomic(path string, data []byte) error {
	dir := filepath.Dir(path)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return err
	}
	f, err := os.CreateTemp(dir, ".artifact-")
	if err != nil {
		return err
	}
	_, err = f.Write(data)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(f.Name(), path)
	}
	if err != nil {
		os.Remove(f.Name())
	}
	return err
}

// childOutput moves what a compiler child wrote into its private directory
// (dir, inside the cache directory) into the cache directory, and returns
// it as an artifact of the module (without MAC) when it can be shared.
func (r *Runtime) childOutput(dir, hash string) (*Artifact, error) {
	var rel string
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.Type().IsRegular() {
			if rel != "" {
				return errors.New("more than one file")
			}
			rel, err = filepath.Rel(dir, p)
		}
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("runtime: compiler child's output: %w", err)
	}
	if rel == "" {
		return nil, errors.New("runtime: the compiler child wrote no code")
	}
	src := filepath.Join(dir, rel)
	var a *Artifact
	name := filepath.ToSlash(rel)
	if r.platform != "" && validArtifactName(r.platform, name) {
		if st, err := os.Stat(src); err == nil && st.Size() <= r.cfg.Limits.ModuleArtifactBytes {
			code, err := os.ReadFile(src)
			if err != nil {
				return nil, err
			}
			a = &Artifact{ModuleHash: hash, Platform: r.platform, Name: name, Code: code}
		}
	}
	dst := filepath.Join(r.cacheDir, rel)
	if err := os.MkdirAll(filepath.Dir(dst), 0o700); err != nil {
		return nil, err
	}
	if err := os.Rename(src, dst); err != nil {
		return nil, err
	}
	return a, nil
}

// storeArtifact shares a module compiled here.
func (r *Runtime) storeArtifact(ctx context.Context, sh *artifactSharing, a *Artifact) {
	a.MAC = artifactMAC(sh.key, a)
	if err := sh.store.StoreArtifact(ctx, a); err != nil {
		r.metrics.artifacts.WithLabelValues("failed").Inc()
		r.log.Warn("bot module artifact: store", "hash", a.ModuleHash, "err", err)
		return
	}
	r.metrics.artifacts.WithLabelValues("stored").Inc()
}

// prepFingerprint identifies what preparing a module depends on besides its
// bytes: the module budget and the stack limit. A replica uses another's
// prepared module only if they agree (else it prepares the module itself,
// and wazero then finds no code for its own preparation: it compiles).
func (r *Runtime) prepFingerprint() [32]byte {
	return sha256.Sum256(fmt.Appendf(nil, "%+v/%d", r.budget, r.stackSlots))
}

// encodePrepared is fingerprint, instance bytes, image length, image,
// prepared module.
func (r *Runtime) encodePrepared(prepared []byte, info *moduleInfo) []byte {
	fp := r.prepFingerprint()
	out := make([]byte, 0, 32+8+8+len(info.image)+len(prepared))
	out = append(out, fp[:]...)
	out = binary.LittleEndian.AppendUint64(out, info.instanceBytes)
	out = binary.LittleEndian.AppendUint64(out, uint64(len(info.image)))
	out = append(out, info.image...)
	return append(out, prepared...)
}

// decodePrepared undoes encodePrepared; nil when b is not for this runtime.
func (r *Runtime) decodePrepared(b []byte) ([]byte, *moduleInfo) {
	fp := r.prepFingerprint()
	if len(b) < 48 || !bytes.Equal(b[:32], fp[:]) {
		return nil, nil
	}
	info := &moduleInfo{instanceBytes: binary.LittleEndian.Uint64(b[32:40])}
	n := binary.LittleEndian.Uint64(b[40:48])
	if n > uint64(len(b)-48) {
		return nil, nil
	}
	if n > 0 {
		info.image = b[48 : 48+n]
	}
	prepared := b[48+n:]
	if len(prepared) == 0 {
		return nil, nil
	}
	return prepared, info
}
