// Package policy owns tunwall's allowlist: the rule model, parsing of the
// YAML policy file (version 1) with file:line:col errors, phases, the
// per-flow verdict (DecideName, DecideIP, NameAllowed), the never-dial guard
// applied to real addresses at dial time (CheckDial), and learn-mode
// aggregation of observed flows into a suggested policy file (Suggest).
//
// The package is pure: it opens no sockets, reads no clock, logs nothing and
// imports neither gVisor nor miekg/dns. The only I/O is ParseFile reading the
// policy file; everything else is a function of its arguments, so every
// decision can be table-tested and fuzzed. deps_test.go enforces this.
//
// The model is default deny. A flow is allowed only by a rule that matches its
// name (host rules) or address (cidr rules), its port and its protocol. Host
// rules are exact names or "*.suffix" wildcards, which match any name strictly
// below the suffix at any depth and never the suffix itself. Addresses in the
// guard set (loopback, RFC 1918, link-local, cloud metadata, ...; see Guard)
// are never dialled unless a cidr rule names them explicitly, however the
// name that led there was allowed.
//
// A host rule may add an HTTP layer (http.go): an http list restricting the
// requests on its flows (DecideRequest), an inject list naming the secrets
// its requests receive, and a ca for verifying its server. Such hosts have
// their flows terminated by tunwall (HTTPFor). The policy holds the names of
// secrets and where their values are read (Secrets, ParseSecret), never a
// value.
package policy
