package hl7

import (
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"testing"
)

// corpusDir is the HL7 corpus kept in the repository (its README gives
// origins and licences).
const corpusDir = "testdata/corpus"

type corpusFile struct {
	name string // relative to corpusDir, with forward slashes
	data []byte
}

var corpusCache []corpusFile

// loadCorpus returns every *.hl7 file of the corpus.
func loadCorpus(tb testing.TB) []corpusFile {
	tb.Helper()
	if corpusCache != nil {
		return corpusCache
	}
	var out []corpusFile
	err := filepath.WalkDir(corpusDir, func(p string, d os.DirEntry, err error) error {
		if err != nil || d.IsDir() || !strings.HasSuffix(p, ".hl7") {
			return err
		}
		b, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(corpusDir, p)
		out = append(out, corpusFile{filepath.ToSlash(rel), b})
		return nil
	})
	if err != nil {
		tb.Fatal(err)
	}
	if len(out) < 200 {
		tb.Fatalf("corpus has only %d files", len(out))
	}
	sort.Slice(out, func(i, j int) bool { return out[i].name < out[j].name })
	corpusCache = out
	return out
}

// rejected lists the corpus files that are rejected on purpose, with the
// reason expected in the *ParseError.
var rejected = map[string]string{
	"cdc/InvalidMessage.hl7":            "does not start with MSH",
	"batch/pyhl7_sample_bad_batch.hl7":  "outside a message",
	"batch/pyhl7_sample_bad_batch1.hl7": "BHS while a batch is open",
	"batch/pyhl7_sample_bad_file.hl7":   "outside a message",
	"batch/pyhl7_sample_bad_file1.hl7":  "BHS while a batch is open",
	"batch/pyhl7_sample_bad_file2.hl7":  "FHS is not the first segment",
	"batch/pyhl7_sample_bad_file3.hl7":  "outside a message",
}

func TestCorpusParseRoundTrip(t *testing.T) {
	files := loadCorpus(t)
	nmsg := 0
	for _, f := range files {
		b, err := ParseBatch(f.data)
		if want, bad := rejected[f.name]; bad {
			var pe *ParseError
			if err == nil {
				t.Errorf("%s: parsed, want a ParseError (%s)", f.name, want)
			} else if !asParseError(err, &pe) || !strings.Contains(pe.Reason, want) {
				t.Errorf("%s: error %v, want a ParseError containing %q", f.name, err, want)
			}
			continue
		}
		if err != nil {
			t.Errorf("%s: %v", f.name, err)
			continue
		}
		in := bytes.TrimPrefix(f.data, []byte("\xEF\xBB\xBF"))
		if !bytes.Equal(b.Bytes(), in) || !bytes.Equal(b.AppendTo(nil), in) {
			t.Errorf("%s: batch does not round-trip", f.name)
		}
		nmsg += len(b.Messages)
		if len(b.Messages) == 1 && len(b.Envelope()) == 0 {
			m, err := Parse(f.data)
			if err != nil {
				t.Errorf("%s: Parse: %v", f.name, err)
				continue
			}
			if !bytes.Equal(m.Bytes(), in) || !bytes.Equal(m.AppendTo(nil), in) {
				t.Errorf("%s: message does not round-trip", f.name)
			}
		}
		for i, m := range b.Messages {
			// Forcing the edited path must also be byte-exact.
			m.edited = true
			out := m.AppendTo(nil)
			m.edited = false
			if !bytes.Equal(out, m.data) {
				t.Errorf("%s: message %d: rebuilt serialisation differs", f.name, i)
			}
			// Touch every field.
			for si := 0; si < m.NumSegments(); si++ {
				s := m.SegmentAt(si)
				for fi := 0; fi <= s.NumFields(); fi++ {
					_ = s.Field(fi).Value()
				}
			}
		}
	}
	t.Logf("%d files, %d messages", len(files), nmsg)
}

// TestCorpusManifest: every corpus file is listed in MANIFEST.json with its
// size, origin and a licence whose text is kept beside it, and every listed
// file is there.
func TestCorpusManifest(t *testing.T) {
	files := loadCorpus(t)
	raw, err := os.ReadFile(filepath.Join(corpusDir, "MANIFEST.json"))
	if err != nil {
		t.Fatal(err)
	}
	var manifest []struct {
		File, Repo, Commit, Path, License string
		LicenseFile                       string `json:"license_file"`
		Bytes                             int
	}
	if err := json.Unmarshal(raw, &manifest); err != nil {
		t.Fatal(err)
	}
	listed := map[string]int{}
	for _, e := range manifest {
		listed[e.File] = e.Bytes
		if e.Repo == "" || len(e.Commit) != 40 || e.Path == "" || e.License == "" {
			t.Errorf("%s: origin or licence missing: %+v", e.File, e)
		}
		if _, err := os.Stat(filepath.Join(corpusDir, e.LicenseFile)); err != nil || e.LicenseFile == "" {
			t.Errorf("%s: licence text %q missing", e.File, e.LicenseFile)
		}
	}
	for _, f := range files {
		n, ok := listed[f.name]
		if !ok || n != len(f.data) {
			t.Errorf("%s: %d bytes, manifest lists %d (listed: %v)", f.name, len(f.data), n, ok)
		}
		delete(listed, f.name)
	}
	for name := range listed {
		t.Errorf("%s: in the manifest, not in the corpus", name)
	}
}

func asParseError(err error, pe **ParseError) bool {
	p, ok := err.(*ParseError)
	if ok {
		*pe = p
	}
	return ok
}

// golden is the data written by compat/hl7-golden.mjs.
type golden struct {
	Generator string                `json:"generator"`
	Files     map[string]goldenFile `json:"files"`
}

type goldenFile struct {
	Error    string          `json:"error,omitempty"`
	Messages []goldenMessage `json:"messages,omitempty"`
}

type goldenMessage struct {
	// Segments: one entry per segment, "NAME nfields hash" where hash is the
	// FNV-1a 64 of the fields getField(1..n) joined by NUL, as hex.
	Segments []string `json:"segments"`
}

func fnv64(h uint64, b []byte) uint64 {
	for _, c := range b {
		h ^= uint64(c)
		h *= 1099511628211
	}
	return h
}

const fnvOffset = 14695981039346656037

// segmentSignature computes, for our parse, what the Node script records.
// Medplum's segment name is the whole of field 0 (Segment.Field(0)).
func segmentSignature(s Segment) (string, int, uint64) {
	n := s.NumFields()
	h := uint64(fnvOffset)
	for i := 1; i <= n; i++ {
		if i > 1 {
			h = fnv64(h, []byte{0})
		}
		raw := s.Field(i).Raw()
		if i == 2 && s.Is("MSH") {
			raw = medplumMSH2(s)
		}
		h = fnv64(h, raw)
	}
	return s.Field(0).String(), n, h
}

// medplumMSH2 is MSH-2 as medplum reports it: always the four characters
// after MSH-1, even when MSH-2 is shorter (then the field separator and what
// follows are included). See DIFFERENCES.md.
func medplumMSH2(s Segment) []byte {
	raw := s.Raw()
	return raw[min(4, len(raw)):min(8, len(raw))]
}

func TestMedplumDifferential(t *testing.T) {
	files := loadCorpus(t)
	raw, err := os.ReadFile("testdata/medplum-golden.json")
	if err != nil {
		t.Fatalf("golden file missing (run: cd compat && node hl7-golden.mjs): %v", err)
	}
	var g golden
	if err := json.Unmarshal(raw, &g); err != nil {
		t.Fatal(err)
	}
	if len(g.Files) != len(files) {
		t.Errorf("golden has %d files, corpus %d", len(g.Files), len(files))
	}
	fields := 0
	for _, f := range files {
		gf, ok := g.Files[f.name]
		if !ok {
			t.Errorf("%s: not in golden file", f.name)
			continue
		}
		b, err := ParseBatch(f.data)
		if gf.Error != "" {
			if err == nil {
				t.Errorf("%s: medplum rejects it (%s), we accept it", f.name, gf.Error)
			}
			continue
		}
		if _, bad := rejected[f.name]; bad {
			continue // envelope errors: medplum sees only the messages
		}
		if err != nil {
			t.Errorf("%s: %v", f.name, err)
			continue
		}
		if len(b.Messages) != len(gf.Messages) {
			t.Errorf("%s: %d messages, medplum %d", f.name, len(b.Messages), len(gf.Messages))
			continue
		}
		for mi, m := range b.Messages {
			gm := gf.Messages[mi]
			if m.NumSegments() != len(gm.Segments) {
				t.Errorf("%s: message %d: %d segments, medplum %d", f.name, mi, m.NumSegments(), len(gm.Segments))
				continue
			}
			for si := range gm.Segments {
				name, n, h := segmentSignature(m.SegmentAt(si))
				got := name + " " + itoa(n) + " " + hex64(h)
				if got != gm.Segments[si] {
					t.Errorf("%s: message %d segment %d: got %q, medplum %q", f.name, mi, si, got, gm.Segments[si])
				}
				fields += n
			}
		}
	}
	t.Logf("compared %d fields", fields)
}

func itoa(n int) string {
	if n == 0 {
		return "0"
	}
	var b []byte
	for n > 0 {
		b = append([]byte{byte('0' + n%10)}, b...)
		n /= 10
	}
	return string(b)
}

func hex64(h uint64) string {
	const digits = "0123456789abcdef"
	b := make([]byte, 16)
	for i := 15; i >= 0; i-- {
		b[i] = digits[h&15]
		h >>= 4
	}
	return string(b)
}
