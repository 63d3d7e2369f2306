package harness

// serviceAccountAdmissionArg is the API server's admission flag for the
// ServiceAccount plugin: disabled unless Config.ServiceAccountAdmission.
// (--enable-admission-plugins cannot undo a --disable-admission-plugins
// given earlier: the API server refuses a plugin in both lists.)
func serviceAccountAdmissionArg(cfg Config) string {
	if cfg.ServiceAccountAdmission {
		return "--disable-admission-plugins="
	}
	return "--disable-admission-plugins=ServiceAccount"
}
