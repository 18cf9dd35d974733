package limits

import (
	"os"
	"reflect"
	goruntime "runtime"
	"strings"
	"testing"
)

// TestDefaultSetsEveryField: a limit added to the struct without a default
// fails here (a zero field would mean "the default" with none defined).
func TestDefaultSetsEveryField(t *testing.T) {
	d := reflect.ValueOf(Default())
	for i := 0; i < d.NumField(); i++ {
		if d.Field(i).IsZero() {
			t.Errorf("Default() leaves %s zero", d.Type().Field(i).Name)
		}
	}
}

func TestWithDefaults(t *testing.T) {
	if got := (Limits{}).WithDefaults(); got != Default() {
		t.Fatalf("zero limits: %+v", got)
	}
	// Set fields are kept, including a negative "off".
	l := Limits{JSONBodyBytes: 5, BotLogBytes: -1, AuthRequestsPerMinute: -1, BotTimeout: 1}.WithDefaults()
	if l.JSONBodyBytes != 5 || l.BotLogBytes != -1 || l.AuthRequestsPerMinute != -1 || l.BotTimeout != 1 {
		t.Fatalf("set fields changed: %+v", l)
	}
	if l.TextBodyBytes != Default().TextBodyBytes || l.BotMaxTimeout != Default().BotMaxTimeout {
		t.Fatalf("zero fields not defaulted: %+v", l)
	}
	// Every field is defaulted: perturb each one alone.
	v := reflect.ValueOf(&l).Elem()
	for i := 0; i < v.NumField(); i++ {
		var z Limits
		zv := reflect.ValueOf(&z).Elem()
		zv.Field(i).Set(v.Field(i))
		got := reflect.ValueOf(z.WithDefaults())
		for j := 0; j < v.NumField(); j++ {
			if j != i && got.Field(j).IsZero() {
				t.Errorf("WithDefaults leaves %s zero", v.Type().Field(j).Name)
			}
		}
	}
}

func TestSettings(t *testing.T) {
	d := Default()
	seen := map[*int64]string{}
	names := map[string]bool{}
	for _, s := range Settings() {
		if !strings.HasPrefix(s.Env, "SANDBOT_") || s.Flag == "" || s.Usage == "" || names[s.Env] || names[s.Flag] {
			t.Errorf("setting %+v: names missing or repeated", s)
		}
		names[s.Env], names[s.Flag] = true, true
		p := s.Field(&d)
		if other, ok := seen[p]; ok {
			t.Errorf("%s and %s set the same field", s.Env, other)
		}
		seen[p] = s.Env
		if *p < s.Min || *p > s.Max || s.Min < 0 {
			t.Errorf("%s: default %d outside [%d, %d] (Min must not be negative: -1 marks an unparsable value)", s.Env, *p, s.Min, s.Max)
		}
	}
}

// TestReadmeListsEverySetting: the README's configuration table names every
// variable operators can set (a new row in Settings needs its line there).
func TestReadmeListsEverySetting(t *testing.T) {
	readme, err := os.ReadFile("../README.md")
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range Settings() {
		if !strings.Contains(string(readme), "`"+s.Env+"`") {
			t.Errorf("README.md does not list %s", s.Env)
		}
	}
}

// TestCoresAreNotThePs: serve runs more Ps than cores (docs/decisions.md
// 62); the cores that executions are counted per stay the CPUs.
func TestCoresAreNotThePs(t *testing.T) {
	cpus := goruntime.NumCPU()
	defer goruntime.GOMAXPROCS(goruntime.GOMAXPROCS(2 * cpus))
	if got := Cores(); got != cpus {
		t.Fatalf("Cores() = %d with GOMAXPROCS %d on %d CPUs, want %d", got, 2*cpus, cpus, cpus)
	}
	if got := Default().GuestCores; got != int64(2*cpus) {
		t.Fatalf("default GuestCores = %d with the Ps raised, want twice the %d CPUs", got, cpus)
	}
	goruntime.GOMAXPROCS(1)
	if got := Cores(); got != 1 {
		t.Fatalf("Cores() = %d with GOMAXPROCS 1 (a container's quota of one core), want 1", got)
	}
}
