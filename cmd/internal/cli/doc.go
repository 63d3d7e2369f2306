// Package cli is the command-line plumbing shared by `meshid` and the lean
// `meshid-agent`: environment fallbacks for flags (the only place meshid
// reads the environment), the logger of --log-level, and the agent command
// that turns flags and environment into an agent.Config.
//
// It is linked into meshid-agent, so it imports nothing of the CA side.
package cli
