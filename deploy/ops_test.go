package deploy

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strings"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"github.com/sandbot/sandbot/internal/servertest"
	"github.com/sandbot/sandbot/internal/wasmtest"
)

const (
	dashboardFile = "grafana/sandbot.json"
	rulesFile     = "prometheus/alerts.yml"
	rulesTestFile = "prometheus/alerts_test.yml"
	runbookFile   = "prometheus/README.md"
)

// query is one PromQL expression of the dashboard or the rules, and where.
type query struct {
	where string
	expr  string
}

// alertRule is what the test reads of one alerting rule.
type alertRule struct {
	name, expr, severity, summary, runbook string
}

// readRules reads alerts.yml by its lines: its shape is kept simple for
// that (one `- alert:` per rule, `expr:` inline or a `|` block, annotations
// on one line each), and promtool checks it as YAML and as rules.
func readRules(t *testing.T) []alertRule {
	t.Helper()
	f, err := os.Open(rulesFile)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var rules []alertRule
	var cur *alertRule
	var block *string // the rule field a block scalar is being read into
	keyIndent := 0    // the indentation of its key: the block's lines are deeper
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		line := sc.Text()
		trimmed := strings.TrimSpace(line)
		indent := len(line) - len(strings.TrimLeft(line, " "))
		if block != nil {
			if trimmed == "" || indent > keyIndent {
				*block += trimmed + "\n"
				continue
			}
			block = nil
		}
		key, value, ok := strings.Cut(trimmed, ":")
		if !ok || strings.HasPrefix(trimmed, "#") {
			continue
		}
		value = strings.TrimSpace(value)
		if unq, err := unquoteYAML(value); err == nil {
			value = unq
		}
		switch key {
		case "- alert":
			rules = append(rules, alertRule{name: value})
			cur = &rules[len(rules)-1]
		case "expr":
			if cur == nil {
				t.Fatalf("%s: expr outside an alert: %s", rulesFile, line)
			}
			if value == "|" || value == ">" {
				block, keyIndent = &cur.expr, indent
				continue
			}
			cur.expr = value
		case "severity":
			if cur != nil {
				cur.severity = value
			}
		case "summary":
			if cur != nil {
				cur.summary = value
			}
		case "runbook":
			if cur != nil {
				cur.runbook = value
			}
		case "- record":
			t.Fatalf("%s: recording rules are not read by this test; name metrics directly", rulesFile)
		}
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	return rules
}

// unquoteYAML removes the double quotes of a YAML scalar (the rules file
// quotes with "…" and no escapes beyond \" and \\).
func unquoteYAML(s string) (string, error) {
	if len(s) < 2 || s[0] != '"' || s[len(s)-1] != '"' {
		return "", fmt.Errorf("not quoted")
	}
	return strings.NewReplacer(`\"`, `"`, `\\`, `\`).Replace(s[1 : len(s)-1]), nil
}

// dashboardQueries returns every expr of the dashboard's panels (nested
// rows included) and the queries of its template variables.
func dashboardQueries(t *testing.T) (panels []query, variables []query) {
	t.Helper()
	b, err := os.ReadFile(dashboardFile)
	if err != nil {
		t.Fatal(err)
	}
	var d map[string]any
	if err := json.Unmarshal(b, &d); err != nil {
		t.Fatalf("%s: %v", dashboardFile, err)
	}
	var walk func(path string, v any)
	walk = func(path string, v any) {
		switch v := v.(type) {
		case map[string]any:
			for k, x := range v {
				if k == "expr" {
					s, _ := x.(string)
					panels = append(panels, query{path, s})
					continue
				}
				walk(path+"."+k, x)
			}
		case []any:
			for i, x := range v {
				title := ""
				if m, ok := x.(map[string]any); ok {
					title, _ = m["title"].(string)
				}
				walk(fmt.Sprintf("%s[%d %s]", path, i, title), x)
			}
		}
	}
	walk("panels", d["panels"])
	tpl, _ := d["templating"].(map[string]any)
	list, _ := tpl["list"].([]any)
	for _, v := range list {
		m, _ := v.(map[string]any)
		if m["type"] != "query" {
			continue
		}
		q, _ := m["query"].(map[string]any)
		s, _ := q["query"].(string)
		if s == "" {
			s, _ = m["query"].(string)
		}
		variables = append(variables, query{fmt.Sprintf("templating %v", m["name"]), s})
	}
	return panels, variables
}

// labelValuesRE is Grafana's label_values(selector, label) of a variable.
var labelValuesRE = regexp.MustCompile(`^label_values\((.*),\s*([a-zA-Z_][a-zA-Z0-9_]*)\)$`)

// allQueries is every PromQL expression the dashboard and the rules hold,
// with the labels that template variables read (as a selector's labels).
func allQueries(t *testing.T) []query {
	t.Helper()
	panels, variables := dashboardQueries(t)
	if len(panels) < 30 {
		t.Fatalf("the dashboard has %d queries; its panels were not found", len(panels))
	}
	out := panels
	for _, v := range variables {
		m := labelValuesRE.FindStringSubmatch(v.expr)
		if m == nil {
			t.Fatalf("%s: %q is not label_values(selector, label)", v.where, v.expr)
		}
		// The variable's label must be one the selector's metric has.
		out = append(out, query{v.where, m[1] + " and on (" + m[2] + ") " + m[1]})
	}
	rules := readRules(t)
	if len(rules) < 10 {
		t.Fatalf("%s: %d alerts read", rulesFile, len(rules))
	}
	for _, r := range rules {
		out = append(out, query{rulesFile + " " + r.name, r.expr})
	}
	return out
}

// TestRulesHaveRunbooks checks each alert's annotations and labels, and
// that the runbook (deploy/prometheus/README.md) has a line for it.
func TestRulesHaveRunbooks(t *testing.T) {
	rules := readRules(t)
	readme, err := os.ReadFile(runbookFile)
	if err != nil {
		t.Fatal(err)
	}
	seen := map[string]bool{}
	for _, r := range rules {
		if seen[r.name] {
			t.Errorf("alert %s defined twice", r.name)
		}
		seen[r.name] = true
		if r.expr == "" {
			t.Errorf("%s: no expr read", r.name)
		}
		if !slices.Contains([]string{"critical", "warning", "info"}, r.severity) {
			t.Errorf("%s: severity %q", r.name, r.severity)
		}
		if r.summary == "" || len(r.runbook) < 40 {
			t.Errorf("%s: summary %q, runbook %q: every alert says what happened and what to look at", r.name, r.summary, r.runbook)
		}
		if !regexp.MustCompile(`(?m)^\| ` + "`" + regexp.QuoteMeta(r.name) + "`" + ` \|`).Match(readme) {
			t.Errorf("%s has no row in %s", r.name, runbookFile)
		}
	}
	for _, m := range regexp.MustCompile("(?m)^\\| `(Sandbot[A-Za-z]+)` \\|").FindAllSubmatch(readme, -1) {
		if !seen[string(m[1])] {
			t.Errorf("%s has a row for %s, which %s does not define", runbookFile, m[1], rulesFile)
		}
	}
}

// TestDashboardShape checks what Grafana needs to show every panel: unique
// ids, the datasource variable, a query per target, positions in the grid.
func TestDashboardShape(t *testing.T) {
	b, err := os.ReadFile(dashboardFile)
	if err != nil {
		t.Fatal(err)
	}
	var d struct {
		UID    string `json:"uid"`
		Panels []struct {
			ID         int            `json:"id"`
			Type       string         `json:"type"`
			Title      string         `json:"title"`
			Datasource map[string]any `json:"datasource"`
			GridPos    struct{ H, W, X, Y int }
			Targets    []struct {
				RefID string `json:"refId"`
				Expr  string `json:"expr"`
			} `json:"targets"`
		} `json:"panels"`
	}
	if err := json.Unmarshal(b, &d); err != nil {
		t.Fatal(err)
	}
	if d.UID == "" {
		t.Error("no uid")
	}
	ids := map[int]bool{}
	rows := 0
	for _, p := range d.Panels {
		if ids[p.ID] {
			t.Errorf("panel id %d used twice", p.ID)
		}
		ids[p.ID] = true
		if p.GridPos.W <= 0 || p.GridPos.H <= 0 || p.GridPos.X+p.GridPos.W > 24 {
			t.Errorf("panel %q: grid position %+v", p.Title, p.GridPos)
		}
		if p.Type == "row" {
			rows++
			continue
		}
		if p.Datasource["uid"] != "${datasource}" {
			t.Errorf("panel %q: datasource %v, want the ${datasource} variable", p.Title, p.Datasource)
		}
		if len(p.Targets) == 0 {
			t.Errorf("panel %q has no query", p.Title)
		}
		for _, tg := range p.Targets {
			if tg.RefID == "" || strings.TrimSpace(tg.Expr) == "" {
				t.Errorf("panel %q: target %+v", p.Title, tg)
			}
		}
	}
	// What issue 24 asks the dashboard to show, one row each.
	for _, want := range []string{"HTTP", "Bot executions", "Audit writer and jobs", "Store", "Process"} {
		if !strings.Contains(string(b), `"title": "`+want) {
			t.Errorf("no row %q", want)
		}
	}
	if rows < 5 {
		t.Errorf("%d rows", rows)
	}
}

// TestQueriesParse reads every query with the scanner that
// TestMetricsAreExported relies on, so that a shape it cannot read fails
// here rather than passing unchecked there.
func TestQueriesParse(t *testing.T) {
	for _, q := range allQueries(t) {
		refs, err := parseRefs(q.expr)
		if err != nil {
			t.Errorf("%s: %v\n%s", q.where, err, q.expr)
			continue
		}
		if len(refs.selectors) == 0 {
			t.Errorf("%s names no metric: %s", q.where, q.expr)
		}
	}
	// The scanner itself, on the shapes it must tell apart.
	refs, err := parseRefs(`histogram_quantile(0.99, sum by (route, le) (rate(sandbot_http_request_duration_seconds_bucket{job=~"$job",route!~".*[$]execute.*"}[$__rate_interval]))) > 1
		and on (job) max without (queue) (sandbot_jobs_queued) unless sum(up{job="sandbot"}) by (instance)`)
	if err != nil {
		t.Fatal(err)
	}
	got := fmt.Sprint(refs)
	want := `{[{sandbot_http_request_duration_seconds_bucket [job route] rate} {sandbot_jobs_queued [] max} {up [job] sum}] [route le job queue instance]}`
	if got != want {
		t.Errorf("parseRefs:\n got %s\nwant %s", got, want)
	}
	if _, err := parseRefs(`{__name__=~"sandbot_.*"}`); err == nil {
		t.Error("a selector without a metric name was accepted")
	}
}

// promtool is Debian's prometheus package's checker; CI installs it
// (.ci/run), elsewhere the tests that need it skip without it.
func promtool(t *testing.T) string {
	t.Helper()
	p, err := exec.LookPath("promtool")
	if err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatal("promtool is required in CI (Debian: apt-get install prometheus)")
		}
		t.Skip("no promtool (Debian: apt-get install prometheus)")
	}
	return p
}

// TestPromtool checks the rules (`promtool check rules`), runs their unit
// tests (`promtool test rules`), and checks the dashboard's queries as
// PromQL by writing them, Grafana's variables replaced, as recording rules
// of a temporary file that promtool checks in turn.
func TestPromtool(t *testing.T) {
	bin := promtool(t)
	run := func(args ...string) {
		t.Helper()
		out, err := exec.Command(bin, args...).CombinedOutput()
		if err != nil {
			t.Errorf("promtool %s: %v\n%s", strings.Join(args, " "), err, out)
		} else {
			t.Logf("promtool %s:\n%s", strings.Join(args, " "), out)
		}
	}
	run("check", "rules", rulesFile)
	run("test", "rules", rulesTestFile)

	panels, variables := dashboardQueries(t)
	vars := strings.NewReplacer("$__rate_interval", "5m", "$__interval", "1m", "${datasource}", "x", "$job", "sandbot", "$instance", ".*")
	var b strings.Builder
	b.WriteString("groups:\n  - name: dashboard\n    rules:\n")
	for i, q := range panels {
		e, _ := json.Marshal(vars.Replace(q.expr)) // a JSON string is a YAML string
		fmt.Fprintf(&b, "      - record: dashboard_query_%d\n        expr: %s\n", i, e)
	}
	for i, v := range variables {
		m := labelValuesRE.FindStringSubmatch(v.expr)
		if m == nil {
			t.Fatalf("%s: %q", v.where, v.expr)
		}
		e, _ := json.Marshal(vars.Replace(m[1]))
		fmt.Fprintf(&b, "      - record: dashboard_variable_%d\n        expr: %s\n", i, e)
	}
	file := filepath.Join(t.TempDir(), "dashboard-queries.yml")
	if err := os.WriteFile(file, []byte(b.String()), 0o600); err != nil {
		t.Fatal(err)
	}
	run("check", "rules", file)
}

// family is what a running server exports under one metric name.
type family struct {
	typ    dto.MetricType
	labels map[string]bool
}

// scrape reads the server's /metrics.
func scrape(t *testing.T, url string) map[string]*dto.MetricFamily {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != 200 {
		b, _ := io.ReadAll(resp.Body)
		t.Fatalf("%s: %d %s", url, resp.StatusCode, b)
	}
	p := expfmt.NewTextParser(model.UTF8Validation)
	mfs, err := p.TextToMetricFamilies(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return mfs
}

// hasSeries says whether name has a series whose labels include want.
func hasSeries(mfs map[string]*dto.MetricFamily, name string, want map[string]string) bool {
	mf := mfs[name]
	if mf == nil {
		return false
	}
next:
	for _, m := range mf.GetMetric() {
		for k, v := range want {
			found := false
			for _, l := range m.GetLabel() {
				if l.GetName() == k && l.GetValue() == v {
					found = true
				}
			}
			if !found {
				continue next
			}
		}
		return true
	}
	return false
}

func gaugeValue(mfs map[string]*dto.MetricFamily, name string) float64 {
	total := 0.0
	if mf := mfs[name]; mf != nil {
		for _, m := range mf.GetMetric() {
			total += m.GetGauge().GetValue()
		}
	}
	return total
}

// merge adds the series of from to into.
func merge(into, from map[string]*dto.MetricFamily) {
	for name, mf := range from {
		if have := into[name]; have != nil {
			have.Metric = append(have.Metric, mf.Metric...)
		} else {
			into[name] = mf
		}
	}
}

// exerciseServer makes a running server export the series the dashboard
// and the rules read: API requests (2xx, 4xx), bot deployments (a module
// compiled, a Bot changed), executions that succeed, time out and are
// refused at admission (the server's execution memory budget is one
// mebibyte, so a second execution beside a running one is refused), an
// asynchronous job that runs while /metrics is read (so that the database's
// queue has a running job), and the AuditEvents of all of them. It returns
// every series of every scrape: the job queue's series exist only while a
// job waits or runs.
func exerciseServer(t *testing.T, p *servertest.Process) map[string]*dto.MetricFamily {
	t.Helper()
	seen := map[string]*dto.MetricFamily{}
	c := p.SuperAdmin(t)
	patient := c.Create(map[string]any{"resourceType": "Patient", "name": []any{map[string]any{"family": "Metrics"}}})
	for _, path := range []string{"fhir/R4/Patient/" + patient["id"].(string), "fhir/R4/Patient?family=Metrics", "fhir/R4/Patient/00000000-0000-0000-0000-000000000000"} {
		c.Do("GET", path, nil, "")
	}
	deploy := func(name string, timeout int, module []byte) string {
		id := c.Create(map[string]any{"resourceType": "Bot", "name": name, "timeout": timeout})["id"].(string)
		if r := c.Do("POST", "fhir/R4/Bot/"+id+"/$deploy", module, "application/wasm"); r.Status != 200 {
			t.Fatalf("deploy %s: %d %s", name, r.Status, r.Body)
		}
		return id
	}
	spin := deploy("spin", 3, wasmtest.Reactor(wasmtest.TightLoopBody))
	echo, err := os.ReadFile("../examples/c-echo/c-echo.wasm")
	if err != nil {
		t.Fatal(err)
	}
	quick := deploy("quick", 10, echo)
	if r := c.Do("POST", "fhir/R4/Bot/"+quick+"/$execute", "x", "text/plain"); r.Status != 200 {
		t.Fatalf("execute quick: %d %s", r.Status, r.Body)
	}
	async := func() {
		r := c.DoWith("POST", "fhir/R4/Bot/"+spin+"/$execute", "x", "text/plain", map[string]string{"Prefer": "respond-async"})
		if r.Status != 202 {
			t.Fatalf("asynchronous execute: %d %s", r.Status, r.Body)
		}
	}
	async()
	deadline := time.Now().Add(2 * time.Minute)
	refused, queued := false, false
	for !refused || !queued {
		if time.Now().After(deadline) {
			t.Fatalf("no refusal (%v) or no job in the queue metrics (%v) after 2 minutes:\n%s", refused, queued, p.Output.String())
		}
		mfs := scrape(t, p.Ops+"metrics")
		merge(seen, mfs)
		queued = queued || mfs["sandbot_jobs_queued"] != nil
		if gaugeValue(mfs, "sandbot_bot_executions_in_flight") >= 1 {
			if r := c.Do("POST", "fhir/R4/Bot/"+quick+"/$execute", "x", "text/plain"); r.Status == 429 {
				refused = true
			}
		} else if gaugeValue(mfs, "sandbot_jobs_running") == 0 && !hasSeries(mfs, "sandbot_jobs_queued", nil) {
			async() // the last job ended before it was seen: another
		}
		time.Sleep(20 * time.Millisecond)
	}
	// Wait for a job to end in its timeout and its AuditEvent to be written.
	for {
		mfs := scrape(t, p.Ops+"metrics")
		merge(seen, mfs)
		if hasSeries(mfs, "sandbot_bot_executions_total", map[string]string{"outcome": "timeout"}) &&
			mfs["sandbot_jobs_ended_total"] != nil && hasSeries(mfs, "sandbot_bot_audit_write_lag_seconds", nil) &&
			mfs["sandbot_bot_audit_write_lag_seconds"].GetMetric()[0].GetHistogram().GetSampleCount() > 0 {
			return seen
		}
		if time.Now().After(deadline) {
			t.Fatalf("no timeout, ended job or written AuditEvent after 2 minutes:\n%s", p.Output.String())
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// promGenerated are series Prometheus makes itself for every target, with
// their labels: the rules may name them though no server exports them.
var promGenerated = map[string][]string{"up": {"job", "instance"}}

// targetLabels are the labels Prometheus attaches to every scraped series.
var targetLabels = []string{"job", "instance"}

// TestMetricsAreExported is issue 24's check of the dashboard and the
// rules: a real server (the sandbot binary, on SQLite) is exercised until
// its vector metrics have series, and every metric the dashboard and the
// rules name must be one it exports, with the labels they match and group
// on, and rate(), irate() and increase() only over counters.
func TestMetricsAreExported(t *testing.T) {
	queries := allQueries(t)
	bin := servertest.BuildBinary(t)
	p := servertest.StartProcess(t, bin, t.TempDir(), "", "SANDBOT_EXECUTION_MEMORY_BYTES=1048576", "SANDBOT_LOG_LEVEL=warn")
	mfs := exerciseServer(t, p)

	exported := map[string]family{}
	for name, mf := range mfs {
		f := family{typ: mf.GetType(), labels: map[string]bool{}}
		for _, m := range mf.GetMetric() {
			for _, l := range m.GetLabel() {
				f.labels[l.GetName()] = true
			}
		}
		exported[name] = f
	}
	names := make([]string, 0, len(exported))
	for n := range exported {
		names = append(names, n)
	}
	sort.Strings(names)
	t.Logf("the server exports %d metric families: %s", len(names), strings.Join(names, " "))

	// lookup resolves a selector's name to its family and the labels a
	// selector of it may use; a histogram is read through its _bucket, _sum
	// and _count series, a summary through its quantiles, _sum and _count.
	lookup := func(name string) (f family, allowed map[string]bool, counter bool, err error) {
		allowed = map[string]bool{}
		for _, l := range targetLabels {
			allowed[l] = true
		}
		if ls, ok := promGenerated[name]; ok {
			for _, l := range ls {
				allowed[l] = true
			}
			return family{}, allowed, false, nil
		}
		if f, ok := exported[name]; ok {
			switch f.typ {
			case dto.MetricType_HISTOGRAM:
				return f, nil, false, fmt.Errorf("%s is a histogram: name its _bucket, _sum or _count", name)
			case dto.MetricType_SUMMARY:
				allowed["quantile"] = true
			}
			for l := range f.labels {
				allowed[l] = true
			}
			return f, allowed, f.typ == dto.MetricType_COUNTER, nil
		}
		for _, suffix := range []string{"_bucket", "_sum", "_count"} {
			base, ok := strings.CutSuffix(name, suffix)
			if !ok {
				continue
			}
			f, ok := exported[base]
			if !ok || (f.typ != dto.MetricType_HISTOGRAM && f.typ != dto.MetricType_SUMMARY) || (suffix == "_bucket" && f.typ != dto.MetricType_HISTOGRAM) {
				break
			}
			for l := range f.labels {
				allowed[l] = true
			}
			if suffix == "_bucket" {
				allowed["le"] = true
			}
			return f, allowed, true, nil
		}
		return family{}, nil, false, fmt.Errorf("%s is not exported by the server", name)
	}

	checked := map[string]bool{}
	for _, q := range queries {
		refs, err := parseRefs(q.expr)
		if err != nil {
			t.Errorf("%s: %v", q.where, err)
			continue
		}
		inExpr := map[string]bool{}
		for _, sel := range refs.selectors {
			_, allowed, counter, err := lookup(sel.name)
			if err != nil {
				t.Errorf("%s: %v", q.where, err)
				continue
			}
			checked[sel.name] = true
			for l := range allowed {
				inExpr[l] = true
			}
			for _, l := range sel.labels {
				if !allowed[l] {
					t.Errorf("%s: %s has no label %q (it has %v)", q.where, sel.name, l, keys(allowed))
				}
			}
			if (sel.fn == "rate" || sel.fn == "irate" || sel.fn == "increase") && !counter {
				t.Errorf("%s: %s(%s): not a counter", q.where, sel.fn, sel.name)
			}
		}
		for _, l := range refs.grouping {
			if !inExpr[l] {
				t.Errorf("%s: groups or matches on %q, a label of none of its metrics", q.where, l)
			}
		}
	}
	t.Logf("%d metric names checked against the server", len(checked))
}

func keys(m map[string]bool) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}
