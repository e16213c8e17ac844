// Package node is the node agent (tunwall node): one process serving many
// pods' network namespaces, one session.Session each, at the request of
// the CNI plugin (cmd/tunwall-cni) on a unix socket only root may use.
//
// It owns the pods served (a bounded table), their policies (files in a
// directory, polled, swapped into live sessions), their audit logs (a file
// each, or their lines interleaved on stdout) and the node's metrics. It
// builds a pod's TUN as tunwall attach does (sandbox.Attach), refusing a
// namespace with another way out and dropping one in which a way out
// appears. It decides no flow itself: each pod's session does.
//
// Fail closed: a pod's TUN lives as long as the agent holds its
// descriptor. When the agent exits or dies, every served pod is left with
// lo only; nothing serves it until it is added again.
package node
