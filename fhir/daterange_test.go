package fhir

import (
	"testing"
	"time"
)

func TestParseDateRangePrecision(t *testing.T) {
	at := func(s string) time.Time {
		v, err := time.Parse(time.RFC3339Nano, s)
		if err != nil {
			t.Fatal(err)
		}
		return v
	}
	for _, tc := range []struct {
		in     string
		lo, hi string
	}{
		{"2021", "2021-01-01T00:00:00Z", "2022-01-01T00:00:00Z"},
		{"2021-02", "2021-02-01T00:00:00Z", "2021-03-01T00:00:00Z"},
		{"2021-02-28", "2021-02-28T00:00:00Z", "2021-03-01T00:00:00Z"},
		{"2021-02-28T10:30Z", "2021-02-28T10:30:00Z", "2021-02-28T10:31:00Z"},
		{"2021-02-28T10:30:15Z", "2021-02-28T10:30:15Z", "2021-02-28T10:30:16Z"},
		{"2021-02-28T10:30:15+02:00", "2021-02-28T08:30:15Z", "2021-02-28T08:30:16Z"},
		// An instant with milliseconds is one millisecond, not one second.
		{"2021-02-28T10:30:15.250Z", "2021-02-28T10:30:15.250Z", "2021-02-28T10:30:15.251Z"},
		{"2021-02-28T10:30:15.2509Z", "2021-02-28T10:30:15.250Z", "2021-02-28T10:30:15.251Z"},
	} {
		lo, hi, err := ParseDateRange(tc.in)
		if err != nil {
			t.Errorf("%s: %v", tc.in, err)
			continue
		}
		if !lo.Equal(at(tc.lo)) || !hi.Equal(at(tc.hi)) {
			t.Errorf("%s: [%s, %s), want [%s, %s)", tc.in, lo.Format(time.RFC3339Nano), hi.Format(time.RFC3339Nano), tc.lo, tc.hi)
		}
	}
	for _, bad := range []string{"", "21", "2021-13", "2021-02-30", "yesterday", "2021-02-28T25:00Z", "2021-02-28 10:30"} {
		if _, _, err := ParseDateRange(bad); err == nil {
			t.Errorf("%q: no error", bad)
		}
	}
}
