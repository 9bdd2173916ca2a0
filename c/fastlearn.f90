! fastlearn's Fortran module: the C interface (fastlearn.h) through iso_c_binding, with Fortran strings, optional
! arguments and fl_array_of, which describes an array (real c_float or c_double, integer c_int32_t or c_int64_t, rank
! 1 to 8) to the library without copying it. docs/c_fortran.md is the guide.
!
!   use fastlearn
!   type(c_ptr) :: learn
!   real(c_double), allocatable, target :: u(:,:,:), u_next(:,:,:)   ! (nx, ny, batch): the batch is the last index
!   real(c_double) :: loss
!   if (fl_create("surrogate.toml", learn) /= FL_OK) error stop fl_last_error()
!   if (fl_train_step(learn, fl_array_of(u), fl_array_of(u_next), loss) /= FL_OK) error stop fl_last_error()
!   if (fl_free(learn) /= FL_OK) error stop fl_last_error()
!
! An array handed to fl_array_of must stay where it is until the call that uses the description returns: a whole
! array or a contiguous section, allocatable or with the target attribute, never an expression (whose temporary is
! gone by then). A section with a stride is refused by the library (FL_ERROR_SHAPE), not copied. The description lists the
! dimensions as Fortran declares them, column-major: a u(nx, ny, batch) is a batch of samples that the config
! describes as data.input_shape = [ny, nx], the reverse order (C's view of the same memory).
module fastlearn
  use, intrinsic :: iso_c_binding
  implicit none
  private

  integer(c_int), parameter, public :: FL_OK = 0, FL_ERROR_NULL = 1, FL_ERROR_CONFIG = 2, FL_ERROR_SHAPE = 3, &
                                       FL_ERROR_VALUE = 4, FL_ERROR_STATE = 5, FL_ERROR_IO = 6, &
                                       FL_ERROR_DISTRIBUTED = 7, FL_ERROR_INTERNAL = 8
  integer(c_int32_t), parameter, public :: FL_FLOAT32 = 0, FL_FLOAT64 = 1, FL_INT32 = 2, FL_INT64 = 3, &
                                           FL_ROW_MAJOR = 0, FL_COLUMN_MAJOR = 1
  integer, parameter, public :: FL_MAX_DIMS = 8

  ! The C interface's fl_array: a caller-owned array's address, element type, layout and shape.
  type, bind(C), public :: fl_array
    type(c_ptr) :: data = c_null_ptr
    integer(c_int32_t) :: dtype = FL_FLOAT64
    integer(c_int32_t) :: layout = FL_COLUMN_MAJOR
    integer(c_int32_t) :: ndim = 0
    integer(c_int32_t) :: reserved = 0
    integer(c_int64_t) :: shape(FL_MAX_DIMS) = 0
  end type

  public :: fl_version, fl_last_error, fl_create, fl_create_from_toml, fl_load_export, fl_free, fl_distributed_init, &
            fl_distributed_init_ranks, fl_rank, fl_global_rank, fl_train_step, fl_train_step_n, fl_hold_out, &
            fl_hold_out_n, fl_predict, fl_predict_n, fl_end_steps, &
            fl_steps, fl_resume, fl_save, fl_load, fl_export, fl_array_of

  ! Any rank (assumed-rank arguments): 1 to FL_MAX_DIMS dimensions, the batch last.
  interface fl_array_of
    module procedure array_r4, array_r8, array_i4, array_i8
  end interface

  interface
    function c_version() bind(C, name="fl_version")
      import :: c_ptr
      type(c_ptr) :: c_version
    end function
    function c_last_error() bind(C, name="fl_last_error")
      import :: c_ptr
      type(c_ptr) :: c_last_error
    end function
    function c_create(config_file, learner) bind(C, name="fl_create")
      import :: c_int, c_char, c_ptr
      character(kind=c_char), intent(in) :: config_file(*)
      type(c_ptr), intent(out) :: learner
      integer(c_int) :: c_create
    end function
    function c_create_from_toml(toml, source_name, learner) bind(C, name="fl_create_from_toml")
      import :: c_int, c_char, c_ptr
      character(kind=c_char), intent(in) :: toml(*), source_name(*)
      type(c_ptr), intent(out) :: learner
      integer(c_int) :: c_create_from_toml
    end function
    function c_load_export(export_file, device, learner) bind(C, name="fl_load_export")
      import :: c_int, c_char, c_ptr
      character(kind=c_char), intent(in) :: export_file(*), device(*)
      type(c_ptr), intent(out) :: learner
      integer(c_int) :: c_load_export
    end function
    function c_free(learner) bind(C, name="fl_free")
      import :: c_int, c_ptr
      type(c_ptr), intent(inout) :: learner
      integer(c_int) :: c_free
    end function
    function c_distributed_init(learner) bind(C, name="fl_distributed_init")
      import :: c_int, c_ptr
      type(c_ptr), value :: learner
      integer(c_int) :: c_distributed_init
    end function
    function c_distributed_init_ranks(learner, ranks, n) bind(C, name="fl_distributed_init_ranks")
      import :: c_int, c_int32_t, c_ptr
      type(c_ptr), value :: learner
      integer(c_int32_t), intent(in) :: ranks(*)
      integer(c_int32_t), value :: n
      integer(c_int) :: c_distributed_init_ranks
    end function
    function c_global_rank(learner, rank, world_size) bind(C, name="fl_global_rank")
      import :: c_int, c_int32_t, c_ptr
      type(c_ptr), value :: learner
      integer(c_int32_t), intent(out) :: rank, world_size
      integer(c_int) :: c_global_rank
    end function
    function c_rank(learner, rank, world_size) bind(C, name="fl_rank")
      import :: c_int, c_int32_t, c_ptr
      type(c_ptr), value :: learner
      integer(c_int32_t), intent(out) :: rank, world_size
      integer(c_int) :: c_rank
    end function
    function c_train_step(learner, inputs, targets, loss) bind(C, name="fl_train_step")
      import :: c_int, c_double, c_ptr, fl_array
      type(c_ptr), value :: learner
      type(fl_array), intent(in) :: inputs, targets
      real(c_double), intent(out) :: loss
      integer(c_int) :: c_train_step
    end function
    function c_hold_out(learner, inputs, targets) bind(C, name="fl_hold_out")
      import :: c_int, c_ptr, fl_array
      type(c_ptr), value :: learner
      type(fl_array), intent(in) :: inputs, targets
      integer(c_int) :: c_hold_out
    end function
    function c_predict(learner, inputs, outputs) bind(C, name="fl_predict")
      import :: c_int, c_ptr, fl_array
      type(c_ptr), value :: learner
      type(fl_array), intent(in) :: inputs, outputs
      integer(c_int) :: c_predict
    end function
    function c_train_step_n(learner, n_inputs, inputs, n_targets, targets, loss) bind(C, name="fl_train_step_n")
      import :: c_int, c_int32_t, c_double, c_ptr, fl_array
      type(c_ptr), value :: learner
      integer(c_int32_t), value :: n_inputs, n_targets
      type(fl_array), intent(in) :: inputs(*), targets(*)
      real(c_double), intent(out) :: loss
      integer(c_int) :: c_train_step_n
    end function
    function c_hold_out_n(learner, n_inputs, inputs, n_targets, targets) bind(C, name="fl_hold_out_n")
      import :: c_int, c_int32_t, c_ptr, fl_array
      type(c_ptr), value :: learner
      integer(c_int32_t), value :: n_inputs, n_targets
      type(fl_array), intent(in) :: inputs(*), targets(*)
      integer(c_int) :: c_hold_out_n
    end function
    function c_predict_n(learner, n_inputs, inputs, n_outputs, outputs) bind(C, name="fl_predict_n")
      import :: c_int, c_int32_t, c_ptr, fl_array
      type(c_ptr), value :: learner
      integer(c_int32_t), value :: n_inputs, n_outputs
      type(fl_array), intent(in) :: inputs(*), outputs(*)
      integer(c_int) :: c_predict_n
    end function
    function c_end_steps(learner) bind(C, name="fl_end_steps")
      import :: c_int, c_ptr
      type(c_ptr), value :: learner
      integer(c_int) :: c_end_steps
    end function
    function c_steps(learner, trained, planned, running) bind(C, name="fl_steps")
      import :: c_int, c_int32_t, c_int64_t, c_ptr
      type(c_ptr), value :: learner
      integer(c_int64_t), intent(out) :: trained, planned
      integer(c_int32_t), intent(out) :: running
      integer(c_int) :: c_steps
    end function
  end interface

  interface
    function c_resume(learner, path) bind(C, name="fl_resume")
      import :: c_int, c_char, c_ptr
      type(c_ptr), value :: learner
      character(kind=c_char), intent(in) :: path(*)
      integer(c_int) :: c_resume
    end function
    function c_save(learner, path) bind(C, name="fl_save")
      import :: c_int, c_char, c_ptr
      type(c_ptr), value :: learner
      character(kind=c_char), intent(in) :: path(*)
      integer(c_int) :: c_save
    end function
    function c_load(learner, path) bind(C, name="fl_load")
      import :: c_int, c_char, c_ptr
      type(c_ptr), value :: learner
      character(kind=c_char), intent(in) :: path(*)
      integer(c_int) :: c_load
    end function
    function c_export(learner, path) bind(C, name="fl_export")
      import :: c_int, c_char, c_ptr
      type(c_ptr), value :: learner
      character(kind=c_char), intent(in) :: path(*)
      integer(c_int) :: c_export
    end function
    function c_strlen(s) bind(C, name="strlen")
      import :: c_ptr, c_size_t
      type(c_ptr), value :: s
      integer(c_size_t) :: c_strlen
    end function
  end interface

contains

  ! A C string as a Fortran one.
  function from_c(s) result(text)
    type(c_ptr), intent(in) :: s
    character(len=:), allocatable :: text
    character(kind=c_char), pointer :: chars(:)
    integer :: i, n
    n = int(c_strlen(s))
    call c_f_pointer(s, chars, [n])
    allocate(character(len=n) :: text)
    do i = 1, n
      text(i:i) = chars(i)
    end do
  end function

  ! A Fortran string (trailing blanks dropped) as a C one.
  pure function to_c(text) result(chars)
    character(len=*), intent(in) :: text
    character(kind=c_char, len=:), allocatable :: chars
    chars = trim(text) // c_null_char
  end function

  !> fastlearn's version.
  function fl_version() result(version)
    character(len=:), allocatable :: version
    version = from_c(c_version())
  end function

  !> The message of this thread's last call when it failed ("" after one that succeeded).
  function fl_last_error() result(message)
    character(len=:), allocatable :: message
    message = from_c(c_last_error())
  end function

  !> A learner from a TOML config with data.dataset = "program" (fl_create of the C interface).
  integer(c_int) function fl_create(config_file, learner) result(status)
    character(len=*), intent(in) :: config_file
    type(c_ptr), intent(out) :: learner
    status = c_create(to_c(config_file), learner)
  end function

  !> The same from the config's text; source_name names it in messages (default "config").
  integer(c_int) function fl_create_from_toml(toml, learner, source_name) result(status)
    character(len=*), intent(in) :: toml
    type(c_ptr), intent(out) :: learner
    character(len=*), intent(in), optional :: source_name
    if (present(source_name)) then
      status = c_create_from_toml(to_c(toml), to_c(source_name), learner)
    else
      status = c_create_from_toml(to_c(toml), to_c("config"), learner)
    end if
  end function

  !> A learner that predicts, from an export; device: "auto" (default), "cpu", "cuda" or "cuda:N".
  integer(c_int) function fl_load_export(export_file, learner, device) result(status)
    character(len=*), intent(in) :: export_file
    type(c_ptr), intent(out) :: learner
    character(len=*), intent(in), optional :: device
    if (present(device)) then
      status = c_load_export(to_c(export_file), to_c(device), learner)
    else
      status = c_load_export(to_c(export_file), to_c("auto"), learner)
    end if
  end function

  !> Frees the learner and sets it to c_null_ptr.
  integer(c_int) function fl_free(learner) result(status)
    type(c_ptr), intent(inout) :: learner
    status = c_free(learner)
  end function

  !> Data parallel training from the launcher's environment; before the first step.
  integer(c_int) function fl_distributed_init(learner) result(status)
    type(c_ptr), intent(in) :: learner
    status = c_distributed_init(learner)
  end function

  !> Data parallel training on a subset of the job's ranks (from 0); every rank calls it with the same list.
  integer(c_int) function fl_distributed_init_ranks(learner, ranks) result(status)
    type(c_ptr), intent(in) :: learner
    integer, intent(in) :: ranks(:)
    status = c_distributed_init_ranks(learner, int(ranks, c_int32_t), int(size(ranks), c_int32_t))
  end function

  !> This process's rank in the whole job (from 0) and the job's number of processes.
  integer(c_int) function fl_global_rank(learner, rank, world_size) result(status)
    type(c_ptr), intent(in) :: learner
    integer, intent(out) :: rank
    integer, intent(out), optional :: world_size
    integer(c_int32_t) :: r, w
    status = c_global_rank(learner, r, w)
    rank = int(r)
    if (present(world_size)) world_size = int(w)
  end function

  !> This process's rank (from 0) and the number of processes training together (-1 outside the subset).
  integer(c_int) function fl_rank(learner, rank, world_size) result(status)
    type(c_ptr), intent(in) :: learner
    integer, intent(out) :: rank
    integer, intent(out), optional :: world_size
    integer(c_int32_t) :: r, w
    status = c_rank(learner, r, w)
    rank = int(r)
    if (present(world_size)) world_size = int(w)
  end function

  !> One training step on a batch (inputs and targets from fl_array_of); loss: the batch's loss.
  integer(c_int) function fl_train_step(learner, inputs, targets, loss) result(status)
    type(c_ptr), intent(in) :: learner
    type(fl_array), intent(in) :: inputs, targets
    real(c_double), intent(out), optional :: loss
    real(c_double) :: value
    status = c_train_step(learner, inputs, targets, value)
    if (present(loss)) loss = value
  end function

  !> Sets samples aside for validation (data.held_out > 0).
  integer(c_int) function fl_hold_out(learner, inputs, targets) result(status)
    type(c_ptr), intent(in) :: learner
    type(fl_array), intent(in) :: inputs, targets
    status = c_hold_out(learner, inputs, targets)
  end function

  !> The model's outputs for a batch of inputs, written into the array outputs describes.
  integer(c_int) function fl_predict(learner, inputs, outputs) result(status)
    type(c_ptr), intent(in) :: learner
    type(fl_array), intent(in) :: inputs, outputs
    status = c_predict(learner, inputs, outputs)
  end function

  !> One training step with several inputs and targets (data.input_shapes, data.target_shapes), in their order.
  integer(c_int) function fl_train_step_n(learner, inputs, targets, loss) result(status)
    type(c_ptr), intent(in) :: learner
    type(fl_array), intent(in) :: inputs(:), targets(:)
    real(c_double), intent(out), optional :: loss
    real(c_double) :: value
    status = c_train_step_n(learner, int(size(inputs), c_int32_t), inputs, int(size(targets), c_int32_t), targets, &
                            value)
    if (present(loss)) loss = value
  end function

  !> Sets samples of several inputs and targets aside for validation.
  integer(c_int) function fl_hold_out_n(learner, inputs, targets) result(status)
    type(c_ptr), intent(in) :: learner
    type(fl_array), intent(in) :: inputs(:), targets(:)
    status = c_hold_out_n(learner, int(size(inputs), c_int32_t), inputs, int(size(targets), c_int32_t), targets)
  end function

  !> The model's outputs (one array each) for several inputs.
  integer(c_int) function fl_predict_n(learner, inputs, outputs) result(status)
    type(c_ptr), intent(in) :: learner
    type(fl_array), intent(in) :: inputs(:), outputs(:)
    status = c_predict_n(learner, int(size(inputs), c_int32_t), inputs, int(size(outputs), c_int32_t), outputs)
  end function

  !> Ends the steps now.
  integer(c_int) function fl_end_steps(learner) result(status)
    type(c_ptr), intent(in) :: learner
    status = c_end_steps(learner)
  end function

  !> Steps trained and planned, and whether more are taken.
  integer(c_int) function fl_steps(learner, trained, planned, running) result(status)
    type(c_ptr), intent(in) :: learner
    integer(c_int64_t), intent(out), optional :: trained, planned
    logical, intent(out), optional :: running
    integer(c_int64_t) :: t, p
    integer(c_int32_t) :: r
    status = c_steps(learner, t, p, r)
    if (present(trained)) trained = t
    if (present(planned)) planned = p
    if (present(running)) running = r /= 0
  end function

  !> Before the first step: continue from a checkpoint file, or the newest in a folder.
  integer(c_int) function fl_resume(learner, checkpoint) result(status)
    type(c_ptr), intent(in) :: learner
    character(len=*), intent(in) :: checkpoint
    status = c_resume(learner, to_c(checkpoint))
  end function

  !> The weights and optimizer state now, to a file.
  integer(c_int) function fl_save(learner, file) result(status)
    type(c_ptr), intent(in) :: learner
    character(len=*), intent(in) :: file
    status = c_save(learner, to_c(file))
  end function

  !> Weights (and optimizer state) from fl_save's file or a checkpoint.
  integer(c_int) function fl_load(learner, file) result(status)
    type(c_ptr), intent(in) :: learner
    character(len=*), intent(in) :: file
    status = c_load(learner, to_c(file))
  end function

  !> The trained model, for fl_load_export, load_learner or `fastlearn predict`.
  integer(c_int) function fl_export(learner, file) result(status)
    type(c_ptr), intent(in) :: learner
    character(len=*), intent(in) :: file
    status = c_export(learner, to_c(file))
  end function

  ! The description of an array of `dims` (as declared, column-major) and `dtype`, its address still to set.
  function described(dims, dtype) result(a)
    integer(c_int64_t), intent(in) :: dims(:)
    integer(c_int32_t), intent(in) :: dtype
    type(fl_array) :: a
    a%dtype = dtype
    a%layout = FL_COLUMN_MAJOR
    a%ndim = int(size(dims), c_int32_t)  ! more than FL_MAX_DIMS: the library says so
    a%shape(1:min(size(dims), FL_MAX_DIMS)) = dims(1:min(size(dims), FL_MAX_DIMS))
  end function
  function array_r4(x) result(a)
    real(c_float), intent(in), target :: x(..)
    type(fl_array) :: a
    a = described(shape(x, kind=c_int64_t), FL_FLOAT32)
    if (is_contiguous(x)) then
      a%data = c_loc(x)
    else
      a%reserved = 1  ! the library refuses it by name (a copy of it would be gone when the call comes)
    end if
  end function
  function array_r8(x) result(a)
    real(c_double), intent(in), target :: x(..)
    type(fl_array) :: a
    a = described(shape(x, kind=c_int64_t), FL_FLOAT64)
    if (is_contiguous(x)) then
      a%data = c_loc(x)
    else
      a%reserved = 1  ! the library refuses it by name (a copy of it would be gone when the call comes)
    end if
  end function
  function array_i4(x) result(a)
    integer(c_int32_t), intent(in), target :: x(..)
    type(fl_array) :: a
    a = described(shape(x, kind=c_int64_t), FL_INT32)
    if (is_contiguous(x)) then
      a%data = c_loc(x)
    else
      a%reserved = 1  ! the library refuses it by name (a copy of it would be gone when the call comes)
    end if
  end function
  function array_i8(x) result(a)
    integer(c_int64_t), intent(in), target :: x(..)
    type(fl_array) :: a
    a = described(shape(x, kind=c_int64_t), FL_INT64)
    if (is_contiguous(x)) then
      a%data = c_loc(x)
    else
      a%reserved = 1  ! the library refuses it by name (a copy of it would be gone when the call comes)
    end if
  end function

end module
