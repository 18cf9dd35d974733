package fhir

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"strings"
	"time"

	"github.com/robfig/cron/v3"
)

// A Schedule is when a Bot (Bot.cronString or Bot.cronTiming) or a Cron
// resource runs its bot: one or more five-field cron expressions (minute,
// hour, day of month, month, day of week), in UTC. A six-field expression
// whose first field is seconds is accepted only when the caller allows it
// (limits.Limits.CronFields, for tests).
type Schedule struct {
	// Exprs are the cron expressions; the schedule's ticks are theirs
	// together.
	Exprs []string
	specs []cron.Schedule
}

// Key identifies what the schedule's ticks are (a hash of its
// expressions): two versions of a resource with the same Key tick at the
// same times.
func (s *Schedule) Key() string {
	h := sha256.Sum256([]byte(strings.Join(s.Exprs, "\n")))
	return hex.EncodeToString(h[:8])
}

// Next is the first tick strictly after t.
func (s *Schedule) Next(t time.Time) time.Time {
	var next time.Time
	for _, sp := range s.specs {
		if n := sp.Next(t.UTC()); !n.IsZero() && (next.IsZero() || n.Before(next)) {
			next = n
		}
	}
	return next
}

var (
	fiveFields = cron.NewParser(cron.Minute | cron.Hour | cron.Dom | cron.Month | cron.Dow)
	withSecs   = cron.NewParser(cron.SecondOptional | cron.Minute | cron.Hour | cron.Dom | cron.Month | cron.Dow)
)

// ParseCronString parses a cron expression: five fields, or six with
// seconds first when seconds is set. Descriptors (@daily, @every) are not
// cron fields and are refused, as the reference's validator refuses them.
func ParseCronString(expr string, seconds bool, element string) (*Schedule, error) {
	expr = strings.Join(strings.Fields(expr), " ")
	p := fiveFields
	if seconds {
		p = withSecs
	}
	if strings.HasPrefix(expr, "@") || strings.Contains(expr, "TZ=") {
		return nil, Invalid(fmt.Sprintf("%s: %q is not a five-field cron expression (minute hour day-of-month month day-of-week)", element, expr), element)
	}
	sp, err := p.Parse(expr)
	if err != nil {
		return nil, Invalid(fmt.Sprintf("%s: %q is not a five-field cron expression (minute hour day-of-month month day-of-week): %v", element, expr, err), element)
	}
	if sp.Next(time.Now().UTC()).IsZero() {
		return nil, Invalid(fmt.Sprintf("%s: %q never runs", element, expr), element)
	}
	return &Schedule{Exprs: []string{expr}, specs: []cron.Schedule{sp}}, nil
}

// cronDays maps Timing.repeat.dayOfWeek codes to cron's day numbers.
var cronDays = map[string]string{"sun": "0", "mon": "1", "tue": "2", "wed": "3", "thu": "4", "fri": "5", "sat": "6"}

// unitMinutes is Timing.repeat.periodUnit in minutes (s and ms are below a
// cron's resolution; mo and a have no fixed length).
var unitMinutes = map[string]int{"min": 1, "h": 60, "d": 1440, "wk": 10080}

// ParseTiming reads a FHIR Timing as a schedule. What it supports of
// Timing.repeat, in UTC:
//   - timeOfDay (hh:mm[:00]), each day or on dayOfWeek;
//   - frequency (default 1) per period periodUnit (min, h, d, wk) whose
//     interval is a whole number of minutes dividing an hour, of hours
//     dividing a day, one day, or one week, optionally on dayOfWeek.
//
// Anything else (event dates, bounds, counts, durations, when, offsets,
// ranges, months and years, an interval such as 7 minutes that a cron
// expression cannot keep) is a 400 naming the element, rather than a
// schedule that runs at times nobody asked for.
func ParseTiming(v any) (*Schedule, error) {
	const el = "Bot.cronTiming"
	t, ok := v.(map[string]any)
	if !ok {
		return nil, Invalid(el+" must be a Timing", el)
	}
	for k := range t {
		if k != "repeat" && k != "id" && k != "extension" {
			return nil, Invalid(fmt.Sprintf("%s.%s is not supported in a schedule (use repeat, or Bot.cronString)", el, k), el+"."+k)
		}
	}
	r, ok := t["repeat"].(map[string]any)
	if !ok {
		return nil, Invalid(el+".repeat is required", el+".repeat")
	}
	for k := range r {
		switch k {
		case "frequency", "period", "periodUnit", "dayOfWeek", "timeOfDay", "id", "extension":
		default:
			return nil, Invalid(fmt.Sprintf("%s.repeat.%s is not supported in a schedule (supported: frequency, period, periodUnit, dayOfWeek, timeOfDay; or use Bot.cronString)", el, k), el+".repeat."+k)
		}
	}
	dow := "*"
	if days, ok := r["dayOfWeek"].([]any); ok && len(days) > 0 {
		var nums []string
		for _, d := range days {
			s, _ := d.(string)
			n, ok := cronDays[s]
			if !ok {
				return nil, Invalid(fmt.Sprintf("%s.repeat.dayOfWeek: %v is not a day (mon … sun)", el, d), el+".repeat.dayOfWeek")
			}
			nums = append(nums, n)
		}
		dow = strings.Join(nums, ",")
	}
	var exprs []string
	if times, ok := r["timeOfDay"].([]any); ok && len(times) > 0 {
		if _, ok := r["frequency"]; ok {
			return nil, Invalid(el+".repeat: timeOfDay with frequency is not supported", el+".repeat.frequency")
		}
		if p, ok := r["period"]; ok && !(number(p) == 1 && r["periodUnit"] == "d") {
			return nil, Invalid(el+".repeat: timeOfDay runs daily; a period other than 1 d is not supported", el+".repeat.period")
		}
		for _, tv := range times {
			s, _ := tv.(string)
			var h, m, sec int
			if n, err := fmt.Sscanf(s, "%d:%d:%d", &h, &m, &sec); (err != nil && n < 2) || len(s) < 5 || h > 23 || m > 59 || sec != 0 || h < 0 || m < 0 {
				return nil, Invalid(fmt.Sprintf("%s.repeat.timeOfDay: %q is not a time of day on a whole minute (hh:mm:00)", el, s), el+".repeat.timeOfDay")
			}
			exprs = append(exprs, fmt.Sprintf("%d %d * * %s", m, h, dow))
		}
	} else {
		freq := 1.0
		if f, ok := r["frequency"]; ok {
			freq = number(f)
		}
		period := 1.0
		if p, ok := r["period"]; ok {
			period = number(p)
		}
		unit, _ := r["periodUnit"].(string)
		um, ok := unitMinutes[unit]
		if !ok {
			return nil, Invalid(fmt.Sprintf("%s.repeat.periodUnit %q is not supported in a schedule (min, h, d, wk)", el, unit), el+".repeat.periodUnit")
		}
		if freq < 1 || period <= 0 || freq != float64(int(freq)) {
			return nil, Invalid(el+".repeat: frequency must be a positive integer and period positive", el+".repeat")
		}
		total := period * float64(um) / freq // minutes between runs
		iv := int(total)
		unsupported := Invalid(fmt.Sprintf("%s.repeat: every %g minutes cannot be kept by a cron schedule (supported: a divisor of an hour in minutes, of a day in hours, a day or a week); use Bot.cronString", el, total), el+".repeat")
		switch {
		case total != float64(iv) || iv < 1:
			return nil, unsupported
		case iv < 60 && 60%iv == 0:
			exprs = []string{fmt.Sprintf("*/%d * * * %s", iv, dow)}
		case iv < 1440 && iv%60 == 0 && 24%(iv/60) == 0:
			exprs = []string{fmt.Sprintf("0 */%d * * %s", iv/60, dow)}
		case iv == 1440:
			exprs = []string{"0 0 * * " + dow}
		case iv == 10080 && dow == "*":
			exprs = []string{"0 0 * * 0"}
		default:
			return nil, unsupported
		}
	}
	s := &Schedule{}
	for _, e := range exprs {
		sp, err := fiveFields.Parse(e)
		if err != nil {
			return nil, Invalid(fmt.Sprintf("%s: %v", el, err), el)
		}
		s.Exprs = append(s.Exprs, e)
		s.specs = append(s.specs, sp)
	}
	return s, nil
}

func number(v any) float64 {
	switch n := v.(type) {
	case json.Number:
		f, _ := n.Float64()
		return f
	case float64:
		return n
	case int:
		return float64(n)
	}
	return -1
}

// BotSchedule is a Bot's schedule: Bot.cronTiming, else Bot.cronString
// (the reference's order); nil when it has neither (an empty cronString
// removes the schedule, as on the reference). An invalid one is a 400.
func BotSchedule(bot Resource, seconds bool) (*Schedule, error) {
	if t, ok := bot["cronTiming"]; ok && t != nil {
		return ParseTiming(t)
	}
	if v, ok := bot["cronString"]; ok {
		s, ok := v.(string)
		if !ok {
			return nil, Invalid("Bot.cronString must be a string", "Bot.cronString")
		}
		if strings.TrimSpace(s) == "" {
			return nil, nil
		}
		return ParseCronString(s, seconds, "Bot.cronString")
	}
	return nil, nil
}

// CronJob is a Cron resource read as what it asks.
type CronJob struct {
	Schedule *Schedule
	// BotID is targetReference's id; Membership onBehalfOf's.
	BotID, Membership string
	Active            bool
	// End is endTime (zero: none).
	End time.Time
}

// ParseCron reads a Cron resource; what it lacks or does not hold is a 400
// naming the element.
func ParseCron(r Resource, seconds bool) (*CronJob, error) {
	c := &CronJob{}
	expr, ok := r["cronString"].(string)
	if !ok || strings.TrimSpace(expr) == "" {
		return nil, Invalid("Cron.cronString is required", "Cron.cronString")
	}
	var err error
	if c.Schedule, err = ParseCronString(expr, seconds, "Cron.cronString"); err != nil {
		return nil, err
	}
	target, _ := r["targetReference"].(map[string]any)
	ref, _ := target["reference"].(string)
	typ, id, ok := SplitReference(ref)
	if !ok || typ != "Bot" {
		return nil, Invalid("Cron.targetReference must reference a Bot", "Cron.targetReference")
	}
	c.BotID = id
	obo, _ := r["onBehalfOf"].(map[string]any)
	ref, _ = obo["reference"].(string)
	if typ, id, ok = SplitReference(ref); !ok || typ != "ProjectMembership" {
		return nil, Invalid("Cron.onBehalfOf must reference a ProjectMembership", "Cron.onBehalfOf")
	}
	c.Membership = id
	active, ok := r["active"].(bool)
	if !ok {
		return nil, Invalid("Cron.active is required", "Cron.active")
	}
	c.Active = active
	if e, ok := r["endTime"]; ok {
		s, _ := e.(string)
		t, err := time.Parse(time.RFC3339, s)
		if err != nil {
			return nil, Invalid("Cron.endTime must be an instant", "Cron.endTime")
		}
		c.End = t
	}
	return c, nil
}
