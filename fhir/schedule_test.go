package fhir

import (
	"encoding/json"
	"strings"
	"testing"
	"time"
)

// TestSchedules: cron strings and Timings tick at the times they say, in
// UTC; what a schedule cannot keep is refused.
func TestSchedules(t *testing.T) {
	from := time.Date(2026, 11, 25, 10, 7, 30, 0, time.UTC) // a Wednesday
	timing := func(s string) any {
		var v any
		d := json.NewDecoder(strings.NewReader(s))
		d.UseNumber()
		if err := d.Decode(&v); err != nil {
			t.Fatal(err)
		}
		return v
	}
	for _, c := range []struct {
		bot  Resource
		next []string
	}{
		{Resource{"cronString": "*/15 * * * *"}, []string{"10:15", "10:30"}},
		{Resource{"cronString": "0 8 * * 1-5"}, []string{"Thu 08:00", "Fri 08:00"}},
		{Resource{"cronTiming": timing(`{"repeat":{"period":20,"periodUnit":"min"}}`)}, []string{"10:20", "10:40"}},
		{Resource{"cronTiming": timing(`{"repeat":{"frequency":4,"period":1,"periodUnit":"d"}}`)}, []string{"12:00", "18:00"}},
		{Resource{"cronTiming": timing(`{"repeat":{"timeOfDay":["09:30:00","07:00:00"],"dayOfWeek":["sat"]}}`)}, []string{"Sat 07:00", "Sat 09:30"}},
		{Resource{"cronTiming": timing(`{"repeat":{"period":1,"periodUnit":"d","dayOfWeek":["thu"]}}`)}, []string{"Thu 00:00", "Thu 00:00"}},
		{Resource{"cronTiming": timing(`{"repeat":{"period":1,"periodUnit":"d"}}`), "cronString": "* * * * *"}, []string{"Thu 00:00"}},
	} {
		s, err := BotSchedule(c.bot, false)
		if err != nil || s == nil {
			t.Fatalf("%v: %v", c.bot, err)
		}
		at := from
		for _, want := range c.next {
			at = s.Next(at)
			layout := "15:04"
			if len(want) > 5 {
				layout = "Mon 15:04"
			}
			if got := at.Format(layout); got != want {
				t.Errorf("%v: next %s, want %s (exprs %q)", c.bot, got, want, s.Exprs)
			}
		}
	}
	for _, bad := range []Resource{
		{"cronString": "* * * *"},
		{"cronString": "@hourly"},
		{"cronString": "*/2 * * * * *"},
		{"cronString": "0 0 30 2 *"},
		{"cronString": 5},
		{"cronTiming": timing(`{"repeat":{"period":7,"periodUnit":"min"}}`)},
		{"cronTiming": timing(`{"repeat":{"period":5,"periodUnit":"h"}}`)},
		{"cronTiming": timing(`{"repeat":{"period":1,"periodUnit":"mo"}}`)},
		{"cronTiming": timing(`{"repeat":{"timeOfDay":["08:00:30"]}}`)},
		{"cronTiming": timing(`{"repeat":{"boundsPeriod":{"start":"2026-01-01"},"period":1,"periodUnit":"d"}}`)},
		{"cronTiming": timing(`{"event":["2026-01-01"]}`)},
		{"cronTiming": timing(`{"repeat":{"period":1,"periodUnit":"d","dayOfWeek":["someday"]}}`)},
	} {
		if _, err := BotSchedule(bad, false); err == nil || !IsCode(err, EInvalid) {
			t.Errorf("%v: %v, want a 400", bad, err)
		}
	}
	if s, err := BotSchedule(Resource{"cronString": "*/2 * * * * *"}, true); err != nil || s.Next(from).Sub(from) != 2*time.Second {
		t.Errorf("seconds allowed: %v %v", s, err)
	}
	if s, err := BotSchedule(Resource{"cronString": " "}, false); s != nil || err != nil {
		t.Errorf("an empty cronString is no schedule: %v %v", s, err)
	}
}
