! A 2-D heat solver that trains a surrogate of its own time step while it runs, then uses it: the Fortran version of
! apps/examples/heat_surrogate.cpp (and heat_surrogate.c), through fastlearn's Fortran module.
!   heat_surrogate_fortran CONFIG [WEIGHTS]   (configs/heat_surrogate.toml; WEIGHTS: where to save the trained weights)
! On several ranks (fastlearn launch --nproc-per-node 2 ...) each rank simulates fields of its own.
program heat_surrogate
  use, intrinsic :: iso_c_binding
  use fastlearn
  implicit none

  integer, parameter :: n = 32, batch = 8, restart = 50, rollout = 20
  real(c_double), parameter :: alpha = 0.2d0  ! diffusion number: explicit Euler is stable up to 0.25
  ! Fields as the solver holds them, u(i, j, field): the batch is the last index; C sees (field, j, i), and the
  ! config's data.input_shape [32, 32] is (j, i).
  real(c_double), allocatable, target :: u(:,:,:), next(:,:,:), surrogate(:,:,:), predicted(:,:,:), exact(:,:,:)
  type(c_ptr) :: learn
  character(len=4096) :: config, weights
  integer(c_int64_t) :: state, trained
  integer :: rank, world_size, tick, s
  logical :: running
  real(c_double) :: loss

  if (command_argument_count() < 1) then
    write (0, '(a)') 'usage: heat_surrogate_fortran CONFIG [WEIGHTS]'
    stop 2
  end if
  call get_command_argument(1, config)
  allocate (u(n, n, batch), next(n, n, batch), surrogate(n, n, 1), predicted(n, n, 1), exact(n, n, 1))

  call check(fl_create(config, learn), 'fl_create')
  call check(fl_distributed_init(learn), 'fl_distributed_init')
  call check(fl_rank(learn, rank, world_size), 'fl_rank')
  state = 12345_c_int64_t + 1000_c_int64_t * rank  ! each rank simulates fields of its own

  ! Samples set aside for validation, then the simulation: every tick trains one step on (fields, next fields).
  call noise(u)
  call solver_step(u, next)
  call check(fl_hold_out(learn, fl_array_of(u), fl_array_of(next)), 'fl_hold_out')
  running = .true.
  tick = 0
  do while (running)
    if (mod(tick, restart) == 0) call noise(u)  ! a fresh start now and then
    call solver_step(u, next)
    call check(fl_train_step(learn, fl_array_of(u), fl_array_of(next), loss), 'fl_train_step')
    u = next
    call check(fl_steps(learn, trained=trained, running=running), 'fl_steps')
    tick = tick + 1
  end do

  ! The surrogate in the solver's place: rollout steps from a new field, against the solver's.
  call noise(exact)
  surrogate = exact
  do s = 1, rollout
    call check(fl_predict(learn, fl_array_of(surrogate), fl_array_of(predicted)), 'fl_predict')
    surrogate = predicted
    call solver_step(exact, predicted)
    exact = predicted
  end do
  if (rank == 0) write (*, '(a, i0, a, i0, a, es9.3, a, i0, a, es9.3, a)') 'heat_surrogate_fortran: ', trained, &
      ' steps on ', world_size, ' rank(s), last loss ', loss, '; after ', rollout, ' steps the surrogate is ', &
      100 * norm2(surrogate - exact) / norm2(exact), '% off'
  if (command_argument_count() > 1) then
    call get_command_argument(2, weights)
    call check(fl_save(learn, weights), 'fl_save')
  end if
  call check(fl_free(learn), 'fl_free')

contains

  ! Park-Miller's generator: the same numbers in C, C++ and Fortran (the products fit in 64 bits).
  real(c_double) function uniform()
    state = mod(state * 48271_c_int64_t, 2147483647_c_int64_t)
    uniform = real(state, c_double) / 2147483647.0d0
  end function

  ! Fills the fields in C's order of the same memory: i fastest, then j, then the field.
  subroutine noise(f)
    real(c_double), intent(out) :: f(:,:,:)
    integer :: i, j, b
    do b = 1, size(f, 3)
      do j = 1, n
        do i = 1, n
          f(i, j, b) = uniform()
        end do
      end do
    end do
  end subroutine

  ! One explicit step of u_t = laplacian(u) on each field, the boundary held at zero (a halo of zeros around it).
  subroutine solver_step(f, g)
    real(c_double), intent(in) :: f(:,:,:)
    real(c_double), intent(out) :: g(:,:,:)
    real(c_double) :: h(0:n + 1, 0:n + 1)
    integer :: i, j, b
    h = 0
    do b = 1, size(f, 3)
      h(1:n, 1:n) = f(:, :, b)
      do j = 1, n
        do i = 1, n
          g(i, j, b) = h(i, j) + alpha * ((((h(i - 1, j) + h(i + 1, j)) + h(i, j - 1)) + h(i, j + 1)) - 4.0d0 * h(i, j))
        end do
      end do
    end do
  end subroutine

  subroutine check(status, what)
    integer(c_int), intent(in) :: status
    character(len=*), intent(in) :: what
    if (status /= FL_OK) then
      write (0, '(a, a, a, a, a, i0, a)') 'heat_surrogate_fortran: ', what, ': ', fl_last_error(), ' (status ', &
          status, ')'
      error stop 1
    end if
  end subroutine
end program
