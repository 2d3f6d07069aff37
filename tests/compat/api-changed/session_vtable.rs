// The session-domain vtable of the "changed" compatibility fixture: today's
// fields, except that `get_blocking` returns `u64`. plugin-api's abi.rs
// includes this file instead of expanding the method table when it is
// compiled with cfg offstage_api_variant = "changed" (see build.rs), so the
// deliberately broken field lives here and not in the published crate.

/// The session domain, one field's type changed (a compatibility fixture).
// Its fields are abi.rs's, undocumented here: only the one type matters.
#[allow(missing_docs)]
#[repr(C)]
#[derive(StableAbi)]
#[sabi(kind(Prefix(prefix_ref = SessionDomainRef)))]
#[sabi(missing_field(option))]
pub struct SessionDomainVtable {
    #[sabi(last_prefix_field)]
    pub list: extern "C" fn(HostCtx, RString) -> FfiFuture<AbiResult>,
    pub list_blocking: extern "C" fn(HostCtx, RString) -> AbiResult,
    pub create: extern "C" fn(HostCtx, RString) -> FfiFuture<AbiResult>,
    pub create_blocking: extern "C" fn(HostCtx, RString) -> AbiResult,
    pub get: extern "C" fn(HostCtx, RString) -> FfiFuture<AbiResult>,
    pub get_blocking: extern "C" fn(HostCtx, RString) -> u64,
    pub rename: extern "C" fn(HostCtx, RString) -> FfiFuture<AbiResult>,
    pub rename_blocking: extern "C" fn(HostCtx, RString) -> AbiResult,
    pub remove: extern "C" fn(HostCtx, RString) -> FfiFuture<AbiResult>,
    pub remove_blocking: extern "C" fn(HostCtx, RString) -> AbiResult,
    pub messages: extern "C" fn(HostCtx, RString) -> FfiFuture<AbiResult>,
    pub messages_blocking: extern "C" fn(HostCtx, RString) -> AbiResult,
    pub prompt: extern "C" fn(HostCtx, RString) -> FfiFuture<AbiResult>,
    pub prompt_blocking: extern "C" fn(HostCtx, RString) -> AbiResult,
    pub notice: extern "C" fn(HostCtx, RString) -> FfiFuture<AbiResult>,
    pub notice_blocking: extern "C" fn(HostCtx, RString) -> AbiResult,
    pub interrupt: extern "C" fn(HostCtx, RString) -> FfiFuture<AbiResult>,
    pub interrupt_blocking: extern "C" fn(HostCtx, RString) -> AbiResult,
    pub jobs: extern "C" fn(HostCtx, RString) -> FfiFuture<AbiResult>,
    pub jobs_blocking: extern "C" fn(HostCtx, RString) -> AbiResult,
    pub call_tool: extern "C" fn(HostCtx, RString) -> FfiFuture<AbiResult>,
    pub call_tool_blocking: extern "C" fn(HostCtx, RString) -> AbiResult,
    pub background: extern "C" fn(HostCtx, RString) -> FfiFuture<AbiResult>,
    pub background_blocking: extern "C" fn(HostCtx, RString) -> AbiResult,
    pub wait_idle: extern "C" fn(HostCtx, RString) -> FfiFuture<AbiResult>,
    pub wait_idle_blocking: extern "C" fn(HostCtx, RString) -> AbiResult,
    pub job: extern "C" fn(HostCtx, RString) -> FfiFuture<AbiResult>,
    pub job_blocking: extern "C" fn(HostCtx, RString) -> AbiResult,
    pub job_output: extern "C" fn(HostCtx, RString) -> FfiFuture<AbiResult>,
    pub job_output_blocking: extern "C" fn(HostCtx, RString) -> AbiResult,
    pub cancel_job: extern "C" fn(HostCtx, RString) -> FfiFuture<AbiResult>,
    pub cancel_job_blocking: extern "C" fn(HostCtx, RString) -> AbiResult,
}

/// The plugin side never calls the changed face: it reads as missing.
impl IntoFace<BlockingMethod> for Option<extern "C" fn(HostCtx, RString) -> u64> {
    fn into_face(self) -> Option<BlockingMethod> {
        None
    }
}
