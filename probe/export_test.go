package probe

// Counts is what a Manager did to the kernel so far.
type Counts struct {
	// Reads of the node table by Add, Remove, Ensure and Reconcile
	// (Elements and Problems not included).
	Reads int64
	// Batches sent, and the element changes they carried.
	Batches, Elements int64
}

func CountsOf(m *Manager) Counts {
	return Counts{Reads: m.stats.reads.Load(), Batches: m.stats.batches.Load(), Elements: m.stats.elements.Load()}
}

// HoldKernel keeps the Manager from sending anything until release is
// called: changes made meanwhile queue up as they would behind a batch in
// flight.
func HoldKernel(m *Manager) (release func()) {
	m.kmu.Lock()
	return m.kmu.Unlock
}

// BeforeSend makes f run between the planning and the sending of every
// batch. Set it before the Manager is used.
func BeforeSend(m *Manager, f func()) { m.beforeSend = f }
