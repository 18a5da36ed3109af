#include "server/telemetry/metrics.h"

#include <map>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"

namespace sandbox {

struct Metrics::Cache {
  absl::Mutex mu;
  absl::flat_hash_map<std::string, prometheus::Counter*> calls ABSL_GUARDED_BY(mu);
  absl::flat_hash_map<std::string, prometheus::Histogram*> call_seconds ABSL_GUARDED_BY(mu);
  absl::flat_hash_map<std::string, prometheus::Gauge*> in_flight ABSL_GUARDED_BY(mu);
};

namespace {

const prometheus::Histogram::BucketBoundaries& LatencyBuckets() {
  static const auto* b = new prometheus::Histogram::BucketBoundaries{
      0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300};
  return *b;
}

}  // namespace

Metrics::~Metrics() = default;

Metrics* Metrics::Discard() {
  static Metrics* const sink = new Metrics();
  return sink;
}

Metrics::Metrics()
    : cache_(std::make_unique<Cache>()),
      registry_(std::make_shared<prometheus::Registry>()),
      sessions_(prometheus::BuildGauge()
                    .Name("sandbox_broker_sessions")
                    .Help("Live sessions (each owns one provider sandbox)")
                    .Register(*registry_)),
      creates_(prometheus::BuildCounter()
                   .Name("sandbox_broker_session_creates_total")
                   .Help("Sandboxes created for sessions")
                   .Register(*registry_)),
      create_failures_(prometheus::BuildCounter()
                           .Name("sandbox_broker_session_create_failures_total")
                           .Help("Sandbox creations that failed, by status code")
                           .Register(*registry_)),
      closes_(prometheus::BuildCounter()
                  .Name("sandbox_broker_session_closes_total")
                  .Help("Sessions closed, by reason (client, idle, lifetime, shutdown, gone)")
                  .Register(*registry_)),
      create_seconds_(prometheus::BuildHistogram()
                          .Name("sandbox_broker_session_create_duration_seconds")
                          .Help("Time to create a session's sandbox")
                          .Register(*registry_)),
      calls_(prometheus::BuildCounter()
                 .Name("sandbox_broker_calls_total")
                 .Help("RPCs handled, by method and status code")
                 .Register(*registry_)),
      call_seconds_(prometheus::BuildHistogram()
                        .Name("sandbox_broker_call_duration_seconds")
                        .Help("RPC latency, by provider and method")
                        .Register(*registry_)),
      in_flight_(prometheus::BuildGauge()
                     .Name("sandbox_broker_calls_in_flight")
                     .Help("RPCs being handled now")
                     .Register(*registry_)),
      provider_errors_(prometheus::BuildCounter()
                           .Name("sandbox_broker_provider_errors_total")
                           .Help("Errors from providers, by status code")
                           .Register(*registry_)),
      output_bytes_(prometheus::BuildCounter()
                        .Name("sandbox_broker_output_bytes_total")
                        .Help("Bytes of run output returned")
                        .Register(*registry_)),
      timeouts_(prometheus::BuildCounter()
                    .Name("sandbox_broker_run_timeouts_total")
                    .Help("Runs killed by their timeout")
                    .Register(*registry_)),
      oom_kills_(prometheus::BuildCounter()
                     .Name("sandbox_broker_oom_kills_total")
                     .Help("Runs with a process killed by the sandbox's memory limit")
                     .Register(*registry_)),
      quota_hits_(prometheus::BuildCounter()
                      .Name("sandbox_broker_quota_hits_total")
                      .Help("Writes refused by a sandbox quota (WriteFile), and runs that used a "
                            "workspace quota up (quota: disk or inodes)")
                      .Register(*registry_)),
      limit_refusals_(prometheus::BuildCounter()
                          .Name("sandbox_broker_limit_refusals_total")
                          .Help("Calls refused RESOURCE_EXHAUSTED by a concurrency limit "
                                "(label: its config key)")
                          .Register(*registry_)),
      limit_in_use_(prometheus::BuildGauge()
                        .Name("sandbox_broker_limit_in_use")
                        .Help("Slots of a concurrency limit now held")
                        .Register(*registry_)),
      limit_queued_(prometheus::BuildGauge()
                        .Name("sandbox_broker_limit_queued")
                        .Help("Calls waiting for a slot of a concurrency limit")
                        .Register(*registry_)),
      tenant_runs_in_use_(prometheus::BuildGauge()
                              .Name("sandbox_broker_tenant_runs_in_use")
                              .Help("A tenant's runs holding a max_concurrent_runs_per_tenant slot")
                              .Register(*registry_)),
      tenant_runs_queued_(prometheus::BuildGauge()
                              .Name("sandbox_broker_tenant_runs_queued")
                              .Help("A tenant's calls waiting for a max_concurrent_runs_per_tenant "
                                    "slot")
                              .Register(*registry_)),
      tenant_run_refusals_(prometheus::BuildCounter()
                               .Name("sandbox_broker_tenant_run_refusals_total")
                               .Help("A tenant's calls refused RESOURCE_EXHAUSTED by "
                                     "max_concurrent_runs_per_tenant")
                               .Register(*registry_)),
      degraded_(prometheus::BuildGauge()
                    .Name("sandbox_broker_provider_degraded")
                    .Help("1 while a provider runs in a weaker mode the operator chose "
                          "(local: providers.local.enforcement \"best_effort\")")
                    .Register(*registry_)),
      pool_size_(prometheus::BuildGauge()
                     .Name("sandbox_broker_pool_size")
                     .Help("Ready, unclaimed members of a provider's warm pool")
                     .Register(*registry_)),
      capacity_(prometheus::BuildGauge()
                    .Name("sandbox_broker_provider_capacity")
                    .Help("What a provider's sandboxes together may reserve of a host resource "
                          "(capacity x overcommit; 0 = no limit)")
                    .Register(*registry_)),
      capacity_in_use_(prometheus::BuildGauge()
                           .Name("sandbox_broker_provider_capacity_in_use")
                           .Help("What a provider's sandboxes reserve of a host resource now")
                           .Register(*registry_)),
      pool_hits_(prometheus::BuildCounter()
                     .Name("sandbox_broker_pool_hits_total")
                     .Help("New sessions that took a warm-pool member instead of creating")
                     .Register(*registry_)),
      pool_misses_(prometheus::BuildCounter()
                       .Name("sandbox_broker_pool_misses_total")
                       .Help("New sessions on a pooled provider that created a sandbox, by "
                             "reason (empty: no ready member; mismatch: the spec needs "
                             "creation-time settings)")
                       .Register(*registry_)),
      egress_connections_(prometheus::BuildCounter()
                              .Name("sandbox_broker_egress_connections_total")
                              .Help("Sandbox network decisions (docs/network.md), by decision "
                                    "(allowed, denied) and kind (connection, dns)")
                              .Register(*registry_)),
      egress_bytes_(prometheus::BuildCounter()
                        .Name("sandbox_broker_egress_bytes_total")
                        .Help("Bytes sandboxes moved through allowed connections, by direction "
                              "(out: to the destination, in: back)")
                        .Register(*registry_)) {}

void Metrics::SessionCreated(const std::string& provider, const std::string& tenant,
                             absl::Duration took) {
  sessions_.Add({{"provider", provider}, {"tenant", tenant}}).Increment();
  creates_.Add({{"provider", provider}}).Increment();
  create_seconds_.Add({{"provider", provider}}, LatencyBuckets())
      .Observe(absl::ToDoubleSeconds(took));
}

void Metrics::SessionRecovered(const std::string& provider, const std::string& tenant) {
  sessions_.Add({{"provider", provider}, {"tenant", tenant}}).Increment();
}

void Metrics::SessionCreateFailed(const std::string& provider, const std::string& code) {
  create_failures_.Add({{"provider", provider}, {"code", code}}).Increment();
}

void Metrics::SessionClosed(const std::string& provider, const std::string& tenant,
                            absl::string_view reason) {
  sessions_.Add({{"provider", provider}, {"tenant", tenant}}).Decrement();
  closes_.Add({{"provider", provider}, {"reason", std::string(reason)}}).Increment();
}

prometheus::Counter& Metrics::CallCounter(const std::string& method, const std::string& code) {
  const std::string key = absl::StrCat(method, "\x1f", code);
  absl::MutexLock l(&cache_->mu);
  auto [it, added] = cache_->calls.try_emplace(key, nullptr);
  if (added) it->second = &calls_.Add({{"method", method}, {"code", code}});
  return *it->second;
}

prometheus::Histogram& Metrics::CallHistogram(const std::string& provider,
                                              const std::string& method) {
  const std::string key = absl::StrCat(provider, "\x1f", method);
  absl::MutexLock l(&cache_->mu);
  auto [it, added] = cache_->call_seconds.try_emplace(key, nullptr);
  if (added) {
    it->second = &call_seconds_.Add({{"provider", provider}, {"method", method}}, LatencyBuckets());
  }
  return *it->second;
}

prometheus::Gauge& Metrics::InFlight(const std::string& method) {
  absl::MutexLock l(&cache_->mu);
  auto [it, added] = cache_->in_flight.try_emplace(method, nullptr);
  if (added) it->second = &in_flight_.Add({{"method", method}});
  return *it->second;
}

void Metrics::CallStarted(const std::string& method) { InFlight(method).Increment(); }

void Metrics::CallFinished(const std::string& method, const std::string& provider,
                           const std::string& code, absl::Duration took) {
  InFlight(method).Decrement();
  CallCounter(method, code).Increment();
  CallHistogram(provider, method).Observe(absl::ToDoubleSeconds(took));
}

void Metrics::ProviderError(const std::string& provider, const std::string& code) {
  provider_errors_.Add({{"provider", provider}, {"code", code}}).Increment();
}

void Metrics::ProviderDegraded(const std::string& provider, const std::string& reason) {
  degraded_.Add({{"provider", provider}, {"reason", reason}}).Set(1);
}

void Metrics::OomKilled(const std::string& provider) {
  oom_kills_.Add({{"provider", provider}}).Increment();
}

void Metrics::QuotaHit(const std::string& provider, const std::string& what) {
  quota_hits_.Add({{"provider", provider}, {"quota", what}}).Increment();
}

void Metrics::LimitRefused(const std::string& limit) {
  limit_refusals_.Add({{"limit", limit}}).Increment();
}

void Metrics::LimitState(const std::string& limit, int64_t in_use, int64_t queued) {
  limit_in_use_.Add({{"limit", limit}}).Set(static_cast<double>(in_use));
  limit_queued_.Add({{"limit", limit}}).Set(static_cast<double>(queued));
}

void Metrics::TenantRunLimit(const std::string& tenant, int64_t in_use, int64_t queued) {
  tenant_runs_in_use_.Add({{"tenant", tenant}}).Set(static_cast<double>(in_use));
  tenant_runs_queued_.Add({{"tenant", tenant}}).Set(static_cast<double>(queued));
}

void Metrics::TenantRunRefused(const std::string& tenant) {
  tenant_run_refusals_.Add({{"tenant", tenant}}).Increment();
}

void Metrics::PoolSize(const std::string& provider, int64_t ready) {
  pool_size_.Add({{"provider", provider}}).Set(static_cast<double>(ready));
}

void Metrics::Capacity(const std::string& provider, const std::string& resource, int64_t capacity,
                       int64_t in_use) {
  const std::map<std::string, std::string> labels = {{"provider", provider},
                                                     {"resource", resource}};
  capacity_.Add(labels).Set(static_cast<double>(capacity));
  capacity_in_use_.Add(labels).Set(static_cast<double>(in_use));
}

void Metrics::PoolHit(const std::string& provider) {
  pool_hits_.Add({{"provider", provider}}).Increment();
}

void Metrics::PoolMiss(const std::string& provider, const std::string& reason) {
  pool_misses_.Add({{"provider", provider}, {"reason", reason}}).Increment();
}

void Metrics::EgressDecision(const std::string& provider, bool allowed, bool dns) {
  egress_connections_
      .Add({{"provider", provider},
            {"decision", allowed ? "allowed" : "denied"},
            {"kind", dns ? "dns" : "connection"}})
      .Increment();
}

void Metrics::EgressBytes(const std::string& provider, int64_t out, int64_t in) {
  if (out > 0) egress_bytes_.Add({{"provider", provider}, {"direction", "out"}}).Increment(out);
  if (in > 0) egress_bytes_.Add({{"provider", provider}, {"direction", "in"}}).Increment(in);
}

void Metrics::RunFinished(const std::string& provider, size_t output_bytes, bool timed_out) {
  output_bytes_.Add({{"provider", provider}}).Increment(static_cast<double>(output_bytes));
  if (timed_out) timeouts_.Add({{"provider", provider}}).Increment();
}

}  // namespace sandbox
