package runtime

import (
	"errors"

	"github.com/prometheus/client_golang/prometheus"
)

type metrics struct {
	executions      *prometheus.CounterVec
	duration        *prometheus.HistogramVec
	inFlight        prometheus.Gauge
	compileDuration prometheus.Histogram
	cacheHits       prometheus.Counter
	cacheMisses     prometheus.Counter
	evictions       prometheus.Counter
	cachedBytes     prometheus.Gauge
	guestMemory     prometheus.Histogram
	childCompiles   prometheus.Counter
	artifacts       *prometheus.CounterVec
	compileRefused  prometheus.Counter
	admission       *prometheus.CounterVec
	reservedBytes   prometheus.Gauge
	cpuWait         prometheus.Histogram
	budgetBytes     prometheus.Gauge
}

func newMetrics(reg prometheus.Registerer) *metrics {
	m := &metrics{
		executions: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "sandbot_bot_executions_total",
			Help: "Bot executions by bot runtime (wasm, js) and outcome: success, or the failure kind (timeout, memory, output, trap, exit, envelope, stack, canceled).",
		}, []string{"runtime", "outcome"}),
		duration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "sandbot_bot_execution_duration_seconds",
			Help:    "Wall time of bot executions, instantiation included, by bot runtime (wasm, js).",
			Buckets: []float64{.0005, .001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30, 60, 300, 900},
		}, []string{"runtime"}),
		inFlight: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "sandbot_bot_executions_in_flight",
			Help: "Bot executions currently running.",
		}),
		compileDuration: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "sandbot_bot_compile_duration_seconds",
			Help:    "Time to validate and compile a bot module (or load it from the on-disk cache).",
			Buckets: []float64{.001, .005, .01, .05, .1, .25, .5, 1, 2.5, 5, 10, 30},
		}),
		cacheHits: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "sandbot_bot_module_cache_hits_total",
			Help: "Compile calls answered by an already compiled module.",
		}),
		cacheMisses: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "sandbot_bot_module_cache_misses_total",
			Help: "Compile calls that had to validate and compile the module.",
		}),
		evictions: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "sandbot_bot_module_cache_evictions_total",
			Help: "Compiled modules dropped from memory to keep the cache within its budget.",
		}),
		cachedBytes: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "sandbot_bot_module_cache_bytes",
			Help: "Bytes of the modules whose compiled code is held in memory.",
		}),
		guestMemory: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "sandbot_bot_guest_memory_bytes",
			Help:    "Size of the bot's linear memory when its execution ended.",
			Buckets: prometheus.ExponentialBuckets(64<<10, 2, 12), // 64 KiB .. 128 MiB
		}),
		childCompiles: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "sandbot_bot_compiler_children_total",
			Help: "Compiler child processes started (one per compilation).",
		}),
		artifacts: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "sandbot_bot_module_artifacts_total",
			Help: "Compiled modules shared through the database, by result: loaded (another replica's code, instead of compiling), stored, rejected (failed verification or over the size bound: compiled here instead), unusable (built for another CPU), failed (the database did not answer).",
		}, []string{"result"}),
		compileRefused: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "sandbot_bot_compile_refused_total",
			Help: "Compilations refused because every compile slot was taken and the queue was full.",
		}),
		cpuWait: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "sandbot_bot_cpu_wait_seconds",
			Help:    "Time an execution waited for a core to run guest code on (all its turns together).",
			Buckets: []float64{.0001, .0005, .001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10},
		}),
		admission: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "sandbot_bot_executions_refused_total",
			Help: "Executions refused at admission, by bot runtime (wasm, js) and the budget that was full: node or project.",
		}, []string{"runtime", "budget"}),
		reservedBytes: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "sandbot_bot_execution_reserved_bytes",
			Help: "Memory held by running executions against the execution memory budget.",
		}),
		budgetBytes: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "sandbot_bot_execution_budget_bytes",
			Help: "The execution memory budget (SANDBOT_EXECUTION_MEMORY_BYTES): an execution that would take the reserved bytes past it is refused.",
		}),
	}
	if reg != nil {
		m.executions = register(reg, m.executions)
		m.duration = register(reg, m.duration)
		m.inFlight = register(reg, m.inFlight)
		m.compileDuration = register(reg, m.compileDuration)
		m.cacheHits = register(reg, m.cacheHits)
		m.cacheMisses = register(reg, m.cacheMisses)
		m.evictions = register(reg, m.evictions)
		m.cachedBytes = register(reg, m.cachedBytes)
		m.guestMemory = register(reg, m.guestMemory)
		m.childCompiles = register(reg, m.childCompiles)
		m.artifacts = register(reg, m.artifacts)
		m.compileRefused = register(reg, m.compileRefused)
		m.admission = register(reg, m.admission)
		m.reservedBytes = register(reg, m.reservedBytes)
		m.cpuWait = register(reg, m.cpuWait)
		m.budgetBytes = register(reg, m.budgetBytes)
	}
	return m
}

// runtimeLabel is the runtime label of m's executions: "js" for a
// JavaScript bot (run by the embedded engine), "wasm" for a module.
func runtimeLabel(m *Module) string {
	if m.js != nil {
		return "js"
	}
	return "wasm"
}

// register registers c, or returns the collector already registered under
// the same description (a second Runtime on the same registry shares them).
func register[C prometheus.Collector](reg prometheus.Registerer, c C) C {
	if err := reg.Register(c); err != nil {
		var are prometheus.AlreadyRegisteredError
		if errors.As(err, &are) {
			if existing, ok := are.ExistingCollector.(C); ok {
				return existing
			}
		}
		panic(err)
	}
	return c
}
